"""Paged attention for prefill and mixed batches: variable-length causal attention
of each sequence's new tokens over its cached prefix plus themselves, with K/V read
from the paged pool through block tables.

Legend: T = new tokens (all sequences), S = sequences, Hq/Hkv = query/KV heads
(GQA: query head h reads KV head h // (Hq // Hkv)), D = head dim, N = blocks,
B = block size, M = max blocks per sequence.

Math, for sequence s with L = seq_lens[s] and q_len new tokens starting at
query_start_loc[s]: query i sits at position p = L - q_len + i and
out = softmax(q k^T * scale, masked to keys 0..p) v, softmax in fp32.
Precision contract: fp32 within 1e-4 of the reference; fp16/bf16 within 2e-2.

Kernel (FlashAttention-2 over pages): one program per (query tile, KV head). A tile
holds BLOCK_M rows = BLOCK_Q consecutive new tokens x the GROUP query heads that
share the KV head, so each K/V tile is loaded once for the whole group. Programs
find their sequence by binary search over query_start_loc: sequence s owns tiles
query_start_loc[s] // BLOCK_Q + s onwards, so a grid of T // BLOCK_Q + S tiles
covers every sequence without a host sync. (Tiles run in order: a sequence's heavy last tiles first
was slower, decision 0012.) Keys are visited in BLOCK_N tiles whose
rows are gathered through the block table (any block size); tiles wholly below the
tile's first query position skip the causal mask, the last few apply it. Where a key tile
fits inside one block (USE_TMA: 16-bit, power-of-two head dim, blocks of 64 tokens or a
multiple on an H100/H200), the unmasked tiles are loaded as TMA boxes of the pool seen as
[N * B, Hkv * D] instead, and so are the diagonal tiles but the one holding the sequence's end:
no addresses to compute or hold (decision 0011). Online
softmax in fp32 with exp2 and log2(e) folded into the scale; no T x L matrix is
ever stored. Head dims that are not a power of two are padded with masked lanes.
NOTE: query_start_loc[0] must be 0 and block_tables must hold a valid block id for
every position below seq_lens (the engine's metadata guarantees both).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels._launch import check_device, check_index, dot_dtype, dot_precision, interpreting
from kernels._online_softmax import attend_tile
from kernels.paged_kv import box_kv_tiles, check_paged_kv, check_window, gather_kv_tiles, load_kv_tile, tma_fits


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q: tl.constexpr):
    """Largest s with query_start_loc[s] // BLOCK_Q + s <= tile_id (binary search)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_seqs"])  # keeps the binary search's bound a run-time int, even when it is 1
def _prefill_kernel(
    q_ptr,  # [T, Hq, D]
    k_cache_ptr,  # [N, B, Hkv, D]
    v_cache_ptr,  # [N, B, Hkv, D]
    k_desc,  # USE_TMA: TMA descriptor of k_cache seen as [N * B, Hkv * D], block [BLOCK_N, D]; else None
    v_desc,
    out_ptr,  # [T, Hq, D] contiguous
    block_tables_ptr,  # [S, M]
    seq_lens_ptr,  # [S]
    query_start_loc_ptr,  # [S + 1]
    num_seqs,
    qk_scale,  # softmax scale * log2(e)
    window,  # WINDOW: a query at position p sees keys p - window + 1 .. p only
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_Q: tl.constexpr,  # new tokens per tile; BLOCK_Q * GROUP <= BLOCK_M
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,  # key tiles as TMA boxes (BLOCK_D == HEAD_DIM, PAGE_SIZE % BLOCK_N == 0)
    WINDOW: tl.constexpr,  # a sliding window: key tiles before the tile's first window are never loaded
):
    tile_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile = tile_id - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return  # the spare tile of a sequence, or a sequence with no new tokens
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # cached prefix

    rows = tl.arange(0, BLOCK_M)
    tok = tile * BLOCK_Q + rows // GROUP  # [BLOCK_M] new-token index inside the sequence
    head = kv_head * GROUP + rows % GROUP  # [BLOCK_M] query head
    row_mask = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    # NOTE: padding rows take the position of the tile's last token so that they see
    # key 0 like every row and stay finite; they are never stored.
    q_pos = context_len + tl.minimum(tok, q_len - 1)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_pos = context_len + tile * BLOCK_Q
    last_pos = context_len + tl.minimum((tile + 1) * BLOCK_Q, q_len) - 1
    unmasked_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # keys [0, unmasked_end) are visible to every row
    full_from = 0
    if WINDOW:
        # keys [key_from, full_from) are seen by some rows only; with the causal keys [full_from, unmasked_end)
        # are seen by all; tiles below key_from by none, and are never loaded
        key_from = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
        full_from = tl.maximum(tl.cdiv(tl.maximum(last_pos - window + 1, 0), BLOCK_N) * BLOCK_N, key_from)
        full_from = tl.minimum(full_from, unmasked_end)
        for start in range(key_from, full_from, BLOCK_N):
            if USE_TMA:
                k, v = box_kv_tiles(k_desc, v_desc, table, start, kv_head, PAGE_SIZE, HEAD_DIM, DOT_DTYPE)
            else:
                k, v = gather_kv_tiles(k_cache_ptr, v_cache_ptr, table, start + tl.arange(0, BLOCK_N), kv_head,
                                       stride_kn, stride_kb, stride_kh, stride_vn, stride_vb, stride_vh,
                                       PAGE_SIZE, HEAD_DIM, BLOCK_D, DOT_DTYPE)  # fmt: skip
            visible = (start + tl.arange(0, BLOCK_N))[None, :] > q_pos[:, None] - window
            acc, m_i, l_i = attend_tile(q, k, v, visible, acc, m_i, l_i, qk_scale, True, True, DOT_DTYPE,
                                        DOT_PRECISION)  # fmt: skip

    for start in range(full_from, unmasked_end, BLOCK_N):
        if USE_TMA:
            k, v = box_kv_tiles(k_desc, v_desc, table, start, kv_head, PAGE_SIZE, HEAD_DIM, DOT_DTYPE)
        else:
            k, v = gather_kv_tiles(k_cache_ptr, v_cache_ptr, table, start + tl.arange(0, BLOCK_N), kv_head,
                                   stride_kn, stride_kb, stride_kh, stride_vn, stride_vb, stride_vh,
                                   PAGE_SIZE, HEAD_DIM, BLOCK_D, DOT_DTYPE)  # fmt: skip
        acc, m_i, l_i = attend_tile(q, k, v, True, acc, m_i, l_i, qk_scale, False, False, DOT_DTYPE, DOT_PRECISION)

    gathered_from = unmasked_end
    if USE_TMA:
        # diagonal tiles whose keys all exist are boxes too; the one holding the sequence's end
        # keeps the gathers, which read its keys past seq_len as 0 (a block's unused slots may
        # hold anything, NaN included)
        gathered_from = tl.maximum(unmasked_end, tl.minimum(tl.cdiv(last_pos + 1, BLOCK_N) * BLOCK_N,
                                                            seq_len // BLOCK_N * BLOCK_N))  # fmt: skip
        for start in range(unmasked_end, gathered_from, BLOCK_N):
            k, v = box_kv_tiles(k_desc, v_desc, table, start, kv_head, PAGE_SIZE, HEAD_DIM, DOT_DTYPE)
            visible = (start + tl.arange(0, BLOCK_N))[None, :] <= q_pos[:, None]
            if WINDOW:
                visible = visible & ((start + tl.arange(0, BLOCK_N))[None, :] > q_pos[:, None] - window)
            acc, m_i, l_i = attend_tile(q, k, v, visible, acc, m_i, l_i, qk_scale, True, WINDOW, DOT_DTYPE,
                                        DOT_PRECISION)  # fmt: skip

    for start in range(gathered_from, last_pos + 1, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        in_seq = kpos < seq_len
        pages = tl.load(table + kpos // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
        offsets = kpos % PAGE_SIZE
        k = load_kv_tile(k_cache_ptr, pages, offsets, kv_head, in_seq, stride_kn, stride_kb, stride_kh,
                          HEAD_DIM, BLOCK_D, True, DOT_DTYPE)  # fmt: skip
        v = load_kv_tile(v_cache_ptr, pages, offsets, kv_head, in_seq, stride_vn, stride_vb, stride_vh,
                          HEAD_DIM, BLOCK_D, True, DOT_DTYPE)  # fmt: skip
        visible = kpos[None, :] <= q_pos[:, None]
        if WINDOW:
            visible = visible & (kpos[None, :] > q_pos[:, None] - window)
        acc, m_i, l_i = attend_tile(q, k, v, visible, acc, m_i, l_i, qk_scale, True, WINDOW, DOT_DTYPE,
                                    DOT_PRECISION)  # fmt: skip

    out = acc / l_i[:, None]
    out_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + out_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask[None, :])  # fmt: skip


TILE_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_TMA")
TMA_BLOCK_N = 64  # the key tile of the TMA path, which the pool's block size must be a multiple of
# NOTE: below this many query tokens the TMA path gains no GPU time, and its two descriptors cost host
# time that Triton's launcher encodes at every call (decision 0011). Eager prefill steps of short
# prompts (and every layer's call) would pay it; so those keep the pointer gathers.
TMA_MIN_QUERY_TOKENS = 512


def _tile_config(head_dim: int, dtype: torch.dtype, group: int, max_query_len: int, page_size: int, tma: bool,
                 tiles: dict | None) -> dict:  # fmt: skip
    """Tile sizes, warps, pipeline depth and load path for a head dim, dtype, query length and pool
    block size (`tma`: tma_fits; `tiles` overrides any of them).

    16-bit, D <= 128, a pool of blocks of 64 tokens or a multiple, at least TMA_MIN_QUERY_TOKENS
    query tokens: 128 query rows, keys in TMA boxes of 64, 4 warps and 3 stages. A box must lie inside
    one block, and two 16-token boxes a tile were slower than the pointer gathers, so smaller blocks keep
    those: keys in tiles of 32 with 4 warps and 4 stages for queries up to 4k, of 128 with 8 warps
    and 3 stages beyond, each the sweep's best for its lengths (decision 0011). D = 256 and fp32 halve the
    tiles to fit shared memory.
    NOTE: the 4-warp, 128-row pointer tile spills registers (Nsight Compute, decision 0011). The
    interpreter gets small tiles so that small test shapes still cross tile borders.
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    use_tma = False
    if interpreting():
        block_m, block_n, warps, stages = 32, 16, 4, 1
        use_tma = tma and page_size % block_n == 0
    elif dtype == torch.float32 or block_d > 128:
        block_m, block_n, warps, stages = 64, 32, 8 if block_d > 128 else 4, 2
    elif tma and page_size % TMA_BLOCK_N == 0 and max_query_len >= TMA_MIN_QUERY_TOKENS:
        block_m, block_n, warps, stages, use_tma = 128, TMA_BLOCK_N, 4, 3, True
    elif max_query_len < 4096:
        block_m, block_n, warps, stages = 128, 32, 4, 4
    else:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    config = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages, USE_TMA=use_tma)
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    config.update(tiles or {})
    if config["USE_TMA"] and not (tma and page_size % config["BLOCK_N"] == 0):
        raise ValueError(f"USE_TMA needs tma_fits and a block size ({page_size}) that BLOCK_N "
                         f"({config['BLOCK_N']}) divides")  # fmt: skip
    config["BLOCK_M"] = max(config["BLOCK_M"], triton.next_power_of_2(group))
    return dict(config, BLOCK_D=block_d, BLOCK_Q=config["BLOCK_M"] // group)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    window: int | None = None,
    tiles: dict | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over the paged K/V of each sequence -> new tensor [T, Hq, D].

    window: a query at position p sees keys p - window + 1 .. p only; key tiles wholly before a query tile's
    first window are skipped (neither loaded nor computed). None: every key up to p.

    max_query_len picks the tile shape (the grid is sized from T, so an understated
    value costs speed, never correctness). tiles overrides BLOCK_M, BLOCK_N, num_warps or num_stages (benchmark sweeps).
    """
    check_device(_prefill_kernel, "q, k_cache, v_cache, block_tables, seq_lens and query_start_loc",
                 q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)  # fmt: skip
    check_paged_kv(q, k_cache, v_cache, block_tables, seq_lens)
    check_index("query_start_loc", query_start_loc, 1)
    check_window(window)
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(f"query_start_loc must have {num_seqs + 1} entries (S + 1), got {query_start_loc.shape[0]}")
    if max_query_len < 0:
        raise ValueError(f"max_query_len must be >= 0, got {max_query_len}")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    page_size = k_cache.shape[1]
    config = _tile_config(head_dim, q.dtype, group, max_query_len, page_size, tma_fits(q, k_cache, v_cache), tiles)
    grid = (num_tokens // config["BLOCK_Q"] + num_seqs, num_kv_heads)
    k_desc = v_desc = None
    if config["USE_TMA"]:
        shape, box = [k_cache.shape[0] * page_size, num_kv_heads * head_dim], [config["BLOCK_N"], head_dim]
        k_desc = TensorDescriptor(k_cache, shape, [k_cache.stride(1), 1], box)
        v_desc = TensorDescriptor(v_cache, shape, [v_cache.stride(1), 1], box)
    _prefill_kernel[grid](
        q, k_cache, v_cache, k_desc, v_desc, out, block_tables, seq_lens, query_start_loc,
        num_seqs, scale * math.log2(math.e), window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        HEAD_DIM=head_dim, GROUP=group, PAGE_SIZE=page_size,
        DOT_DTYPE=dot_dtype(q.dtype), DOT_PRECISION=dot_precision(q.dtype), WINDOW=window is not None,
        **config,
    )  # fmt: skip
    return out


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D] -> out [T, Hq, D]. Loops over sequences (the reference, not the fast path).

    window: a query at position p sees keys p - window + 1 .. p only, and only the blocks holding those
    keys are read; None: every key up to p."""
    check_window(window)
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        q_start, q_end = starts[s], starts[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_blocks = (seq_len + block_size - 1) // block_size
        # the first block any query of the sequence sees (0 without a window)
        first_block = 0 if window is None else max(0, seq_len - q_len - window + 1) // block_size
        blocks = block_tables[s, first_block:num_blocks].long()
        first_key = first_block * block_size
        k = k_cache[blocks].reshape(-1, num_kv_heads, k_cache.shape[-1])[: seq_len - first_key].float()  # [L', Hkv, D]
        v = v_cache[blocks].reshape(-1, num_kv_heads, v_cache.shape[-1])[: seq_len - first_key].float()
        k = k.repeat_interleave(group, dim=1)  # [L', Hq, D]
        v = v.repeat_interleave(group, dim=1)
        qs = q[q_start:q_end].float()  # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qs, k) * scale  # [Hq, q_len, L']
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(first_key, seq_len, device=q.device)[None, :]
        hidden = k_pos > q_pos
        if window is not None:
            hidden |= k_pos <= q_pos - window
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
