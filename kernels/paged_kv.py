"""Reading K/V from the paged pool: what the prefill and decode attention kernels share.

Legend: N = blocks, B = block size, Hkv = KV heads, D = head dim. k_cache, v_cache: [N, B, Hkv, D];
the keys of sequence s at position p sit in block block_tables[s, p // B] at offset p % B.

Two ways to load a tile of BLOCK_N keys of one KV head:
- gathers (load_kv_tile, gather_kv_tiles): each row's address through the block table; any block
  size, masked rows read as 0;
- TMA boxes (box_kv_tiles): BLOCK_N consecutive slots of one block as one rectangle of the pool seen
  as [N * B, Hkv * D], loaded by the copy engine with no per-row address; only where tma_fits and a
  tile lies inside one block. Rows past a sequence's end are whatever the block holds there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_float, check_index, check_last_dim_contiguous, has_tma, interpreting

MAX_HEAD_DIM = 256


@triton.jit
def load_kv_tile(
    cache_ptr,  # [N, B, Hkv, D]
    pages,  # [BLOCK_N] int64 block ids of the tile's keys
    offsets,  # [BLOCK_N] offsets of the keys inside their blocks
    kv_head,
    key_mask,  # [BLOCK_N] bool, read only when MASK_KEYS
    stride_n,
    stride_b,
    stride_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_KEYS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """[BLOCK_N, BLOCK_D] keys or values of one KV head; masked keys and padded lanes read as 0."""
    d = tl.arange(0, BLOCK_D)
    ptrs = cache_ptr + (pages * stride_n + offsets * stride_b + kv_head * stride_h)[:, None] + d[None, :]
    if MASK_KEYS:
        tile = tl.load(ptrs, mask=key_mask[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    elif BLOCK_D != HEAD_DIM:
        tile = tl.load(ptrs, mask=(d < HEAD_DIM)[None, :], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile.to(DOT_DTYPE)


@triton.jit
def gather_kv_tiles(
    k_cache_ptr,  # [N, B, Hkv, D]
    v_cache_ptr,
    table,  # the sequence's row of the block table
    kpos,  # [BLOCK_N] key positions, all below the sequence's length
    kv_head,
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """(keys, values) [BLOCK_N, BLOCK_D] of one KV head at positions kpos, each row found through the
    block table: the unmasked tiles of both attention kernels."""
    pages = tl.load(table + kpos // PAGE_SIZE).to(tl.int64)
    offsets = kpos % PAGE_SIZE
    k = load_kv_tile(k_cache_ptr, pages, offsets, kv_head, kpos, stride_kn, stride_kb, stride_kh,
                     HEAD_DIM, BLOCK_D, False, DOT_DTYPE)  # fmt: skip
    v = load_kv_tile(v_cache_ptr, pages, offsets, kv_head, kpos, stride_vn, stride_vb, stride_vh,
                     HEAD_DIM, BLOCK_D, False, DOT_DTYPE)  # fmt: skip
    return k, v


@triton.jit
def box_kv_tiles(k_desc, v_desc, table, start, kv_head, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                 DOT_DTYPE: tl.constexpr):  # fmt: skip
    """(keys, values) [BLOCK_N, D] of one KV head at positions start.. as TMA boxes: BLOCK_N consecutive
    slots of one block (PAGE_SIZE % BLOCK_N == 0, start a multiple of BLOCK_N)."""
    row = tl.load(table + start // PAGE_SIZE) * PAGE_SIZE + start % PAGE_SIZE
    return k_desc.load([row, kv_head * HEAD_DIM]).to(DOT_DTYPE), v_desc.load([row, kv_head * HEAD_DIM]).to(DOT_DTYPE)


def tma_fits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether K/V tiles can be TMA boxes of the pool seen as [N * B, Hkv * D]: a power-of-two head
    dim, each pool a contiguous [N * B, Hkv, D] run with 16-byte aligned rows, and a Hopper or later
    GPU (or the interpreter, for fp16 and fp32 only: Triton 3.6's interpreter misreads bf16 boxes)."""
    head_dim = q.shape[-1]
    if interpreting():
        if q.dtype == torch.bfloat16:
            return False
    elif not has_tma(q.device):
        return False
    size = q.element_size()
    return head_dim == triton.next_power_of_2(head_dim) and head_dim * size >= 16 and all(
        c.stride(2) == head_dim and c.stride(0) == c.shape[1] * c.stride(1) and c.stride(1) * size % 16 == 0
        and c.data_ptr() % 16 == 0 for c in (k_cache, v_cache))  # fmt: skip


def check_paged_kv(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                   seq_lens: torch.Tensor) -> None:  # fmt: skip
    """Checks shared by the prefill and decode launchers."""
    check_float("q", q)
    if q.dim() != 3:
        raise ValueError(f"q must be [T, Hq, D], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [N, B, Hkv, D], got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")  # fmt: skip
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"head dim of the KV cache ({k_cache.shape[3]}) must match q's ({head_dim})")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be at most {MAX_HEAD_DIM}, got {head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    check_index("block_tables", block_tables, 2)
    check_index("seq_lens", seq_lens, 1)
    if block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {seq_lens.shape[0]} sequences")
    if block_tables.shape[1] > 0 and block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along its last dim")


def check_window(window: int | None) -> None:
    """A sliding window is None (every earlier key) or at least 1 key (the query's own)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
