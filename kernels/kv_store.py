"""KV store: write each new token's K and V into its slot of the paged pool.

Legend: T = new tokens, N = blocks, B = block size, H = KV heads, D = head dim.
k, v: [T, H, D]; k_cache, v_cache: [N, B, H, D]; slot_mapping: [T] int64 with
slot = block * B + offset, -1 meaning skip. Exact copy (no arithmetic; a cast
when the pool's dtype differs from k's).

Kernel: each program copies the keys and values of BLOCK_T consecutive tokens as
one [BLOCK_T, BLOCK_H, BLOCK_D] tile per head chunk, K and V loaded before either
is stored, so a program has 2 x BLOCK_T x BLOCK_H x BLOCK_D elements in flight
(BLOCK_T from KV_STORE_TILE_ELEMENTS: as many tokens as fill 8192 elements of K).
Several tokens a program, not one: the few-token rows of a narrow model are bound by the fixed cost of
any kernel this small (launch, first DRAM round trip, write drain), which no tile removes; torch's own
device copy of the same bytes reaches no more (decision 0034). A token with slot -1 writes nothing.
k and v may be strided views (cut out of a fused qkv projection); the pool may be any
[N, B, H, D] view with a contiguous head dim (kv_cache[0] and kv_cache[1] of the
[2, N, B, H, D] pool).
NOTE: slots are not range-checked on the device (that would need a sync); the
engine's block manager guarantees slot < N * B.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import (
    TOKEN_TILE_ELEMENTS,
    check_device,
    check_float,
    check_index,
    check_last_dim_contiguous,
    token_tile,
)
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

# Elements a program moves per head chunk, K and V each: twice the other per-token kernels' TOKEN_TILE_ELEMENTS,
# which the wide models' rows need to reach the copy-bandwidth goal (decision 0034).
KV_STORE_TILE_ELEMENTS = 2 * TOKEN_TILE_ELEMENTS


@triton.jit
def token_tile_slots(slot_ptr, num_tokens, block_size, stride_cn, stride_cb, BLOCK_T: tl.constexpr):
    """This program's BLOCK_T tokens: (token ids [BLOCK_T] int64, whether each writes into the pool
    [BLOCK_T, 1, 1] (slot >= 0, and a real token), the offset of its pool row [BLOCK_T, 1, 1])."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    cache_row = (slot // block_size) * stride_cn + (slot % block_size) * stride_cb
    return t, (slot >= 0)[:, None, None], cache_row[:, None, None]


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [T, H, D]
    v_ptr,  # [T, H, D]
    k_cache_ptr,  # [N, B, H, D]
    v_cache_ptr,  # [N, B, H, D]
    slot_ptr,  # [T]
    num_tokens,
    num_heads,
    head_dim,
    block_size,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cn,  # cache strides (block, offset, head), shared by k_cache and v_cache
    stride_cb,
    stride_ch,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    # the slots before the wait: staged before the step's first kernel (kernels/_pdl.py)
    t, keep, cache_row = token_tile_slots(slot_ptr, num_tokens, block_size, stride_cn, stride_cb, BLOCK_T)
    pdl_wait(PDL)
    d = tl.arange(0, BLOCK_D)[None, None, :]
    for h0 in range(0, num_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        mask = keep & (h < num_heads) & (d < head_dim)
        key = tl.load(k_ptr + t[:, None, None] * stride_kt + h * stride_kh + d, mask=mask)
        val = tl.load(v_ptr + t[:, None, None] * stride_vt + h * stride_vh + d, mask=mask)
        cache_off = cache_row + h * stride_ch + d
        tl.store(k_cache_ptr + cache_off, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + cache_off, val.to(v_cache_ptr.dtype.element_ty), mask=mask)


def check_kv_and_pool(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:  # fmt: skip
    """The checks store_kv and rope_store_kv share: k, v [T, H, D] against a [N, B, H, D] pool."""
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_float(name, t)
        check_last_dim_contiguous(name, t)
    check_index("slot_mapping", slot_mapping, 1)
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, H, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"k_cache and v_cache must be [N, B, H, D] views of one layout, got {tuple(k_cache.shape)} "
            f"{k_cache.stride()} and {tuple(v_cache.shape)} {v_cache.stride()}"
        )
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}")
    num_tokens, num_heads, head_dim = k.shape
    if k_cache.shape[2:] != (num_heads, head_dim):
        raise ValueError(f"cache heads/head dim {tuple(k_cache.shape[2:])} must match k's {(num_heads, head_dim)}")
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"slot_mapping must have {num_tokens} entries (one per token), got {slot_mapping.shape[0]}")


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    tiles: dict | None = None,
) -> None:
    """Writes k, v [T, H, D] into k_cache, v_cache [N, B, H, D] at slot_mapping [T] (-1: skip).

    tiles overrides BLOCK_T (tokens per program) or num_warps (benchmark sweeps).
    """
    check_device(_store_kv_kernel, "k, v, k_cache, v_cache and slot_mapping", k, v, k_cache, v_cache, slot_mapping)
    check_kv_and_pool(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(num_heads), max(1, TOKEN_TILE_ELEMENTS // block_d))
    config = token_tile(num_tokens, block_h * block_d, k.device, tiles, tile_elements=KV_STORE_TILE_ELEMENTS)
    _store_kv_kernel[(triton.cdiv(num_tokens, config["BLOCK_T"]),)](
        k, v, k_cache, v_cache, slot_mapping,
        num_tokens, num_heads, head_dim, k_cache.shape[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        BLOCK_H=block_h, BLOCK_D=block_d, **config, **pdl_options(k.device),
    )  # fmt: skip


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    n, b = k_cache.shape[0], k_cache.shape[1]
    k_cache.view(n * b, *k_cache.shape[2:])[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(n * b, *v_cache.shape[2:])[slots] = v[keep].to(v_cache.dtype)
