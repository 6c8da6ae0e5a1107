"""Paged attention for decode: one query token per sequence over its whole context,
split along the context (flash-decoding) when the batch is too small to fill the GPU.

Legend: S = sequences, Hq/Hkv = query/KV heads, G = Hq // Hkv, D = head dim,
N = blocks, B = block size, M = max blocks per sequence, P = context splits.

Math: out[s] = softmax(q[s] k[s, :L]^T * scale) v[s, :L] with L = seq_lens[s],
softmax in fp32. Precision contract: fp32 within 1e-4; fp16/bf16 within 2e-2.

Kernel: `_decode_kernel` runs one program per (sequence, KV head, split): the G query
heads of a KV group are the rows of one tile (padded to 16 for tl.dot), so each K/V
tile is read from the pool once per group. Split p of P takes an equal share of
the sequence's BLOCK_N key tiles (computed on the device from seq_lens, so the launch
needs no host sync and is CUDA-graph safe). With P = 1 the program writes the output.
Otherwise it writes its normalized partial output and log-sum-exp, then takes a ticket
from an atomic counter of its (sequence, KV head); the program that draws the last
ticket merges the parts of the group's G heads, weighted by exp2(lse_p - max lse),
and puts the counter back to 0 (merge="kernel" instead runs a second kernel). Splits left
without keys (a context shorter than P tiles) write no part and draw no ticket there: the
last of the splits that hold keys merges theirs. Which merge runs depends on the head dim
(kernels/decode_split_merge.py: the merge, its kernel and choose_merge). P is chosen from the
SM count: enough programs for about two per SM, one when S * Hkv already fills the GPU (that rule,
the length order's and the early first tile's are kernels/decode_grid.py).
Given `order` (the engine passes one for one-split grids of more than a wave: wants_length_order),
the grid is (S * Hkv, 1, P) over the sequences longest context first, each one's KV heads together, so
that long sequences never start in the last wave; output rows stay in the batch's order.
With PDL, where programs are few (reads_first_tile_early), each program loads its first
tile's keys and values before griddepcontrol.wait, all but the newest positions' (`fresh_keys`), which
this step's KV store writes; those rows are loaded after the wait (kernels/_pdl.py says why the rest is
safe to read early). A split's tiles after its first go through a software-pipelined loop only where
it has at least PIPELINE_MIN_TILES of them, one by one below (the kernel's NOTE says why).
NOTE: the counters are kernels._launch.ticket_counters (zero between kernels, one buffer
per device and stream).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, dot_dtype, dot_precision, interpreting, ticket_counters
from kernels._online_softmax import attend_tile
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.decode_grid import MAX_SPLITS, choose_num_splits, reads_first_tile_early
from kernels.decode_split_merge import MERGES, choose_merge, launch_merge, merge_chunk, merge_split_rows
from kernels.paged_kv import check_paged_kv, check_window, gather_kv_tiles, load_kv_tile
from kernels.prefill_attention import paged_prefill_attention_ref

# A split walks its key tiles in a software-pipelined loop (the tile config's num_stages in flight) only
# from this many tiles after its first on; fewer go one by one (see the kernel's NOTE).
PIPELINE_MIN_TILES = 4


@triton.jit
def _attend_full_tiles(
    q, acc, m_i, l_i, lo, hi, k_cache_ptr, v_cache_ptr, table, kv_head,
    stride_kn, stride_kb, stride_kh, stride_vn, stride_vb, stride_vh, qk_scale,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """The online softmax over key tiles lo .. hi - 1, none past the sequence's end (no key mask), with
    STAGES tiles in flight (Triton's software pipelining of this loop; 1: none)."""
    for tile in tl.range(lo, hi, num_stages=STAGES):
        k, v = gather_kv_tiles(k_cache_ptr, v_cache_ptr, table, tile * BLOCK_N + tl.arange(0, BLOCK_N), kv_head,
                               stride_kn, stride_kb, stride_kh, stride_vn, stride_vb, stride_vh,
                               PAGE_SIZE, HEAD_DIM, BLOCK_D, DOT_DTYPE)  # fmt: skip
        acc, m_i, l_i = attend_tile(q, k, v, True, acc, m_i, l_i, qk_scale, False, False, DOT_DTYPE, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _decode_kernel(
    q_ptr,  # [S, Hq, D]
    k_cache_ptr,  # [N, B, Hkv, D]
    v_cache_ptr,  # [N, B, Hkv, D]
    block_tables_ptr,  # [S, M]
    seq_lens_ptr,  # [S]
    order_ptr,  # [S] sequences longest first (read when ORDERED)
    out_ptr,  # [S, Hq, D] contiguous (written when NUM_SPLITS == 1)
    part_out_ptr,  # [S, Hq, P, BLOCK_D] fp32 (written when NUM_SPLITS > 1)
    part_lse_ptr,  # [S, Hq, P] fp32, log2 domain
    counter_ptr,  # [>= S * Hkv] int32, zero between calls (used when NUM_SPLITS > 1)
    qk_scale,  # softmax scale * log2(e)
    window,  # WINDOW: the query sees the sequence's last `window` keys only
    num_kv_heads,
    stride_qs,
    stride_qh,
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,  # GROUP padded to a tl.dot row count
    BLOCK_GROUP: tl.constexpr,  # GROUP padded to a power of two (the merge's rows)
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_P: tl.constexpr,  # NUM_SPLITS padded to a power of two
    P_CHUNK: tl.constexpr,
    MERGE_HERE: tl.constexpr,  # the last split merges (else _merge_splits_kernel runs after)
    EARLY_FIRST_TILE: tl.constexpr,  # the first tile's earlier keys loaded before the PDL wait
    FRESH_KEYS: tl.constexpr,  # the newest positions of a sequence that this step's KV store writes
    ORDERED: tl.constexpr,  # grid (S * Hkv, 1, P) over order_ptr's sequences, KV heads fastest
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LOOP_STAGES: tl.constexpr,  # tiles in flight in a split of at least PIPELINE_MIN_TILES more tiles
    PIPELINE_MIN_TILES: tl.constexpr,
    PDL: tl.constexpr,
    WINDOW: tl.constexpr,  # a sliding window: the splits share the tiles from the window's first on
):
    pdl_launch_dependents(PDL)
    if ORDERED:  # the order is the step's metadata, staged before the forward: read before the wait
        seq = tl.load(order_ptr + tl.program_id(0) // num_kv_heads).to(tl.int32)
        kv_head = tl.program_id(0) % num_kv_heads
    else:
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Before the wait, only what no kernel of this step writes (kernels/_pdl.py): the step's metadata,
    # and the keys and values of every position before the sequence's newest, which earlier steps
    # stored. So the split's first tile streams in while the kernels before this one finish.
    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    first_tile = 0  # the tile holding the first key the query sees; the tiles before it are never loaded
    if WINDOW:
        first_tile = tl.maximum(seq_len - window, 0) // BLOCK_N
    tiles_per_split = tl.cdiv(num_tiles - first_tile, NUM_SPLITS)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
    # The splits that hold keys (at least one, so that a sequence without keys still gets its output, 0).
    # With the last-split merge the others write no part and draw no ticket: a short context over a
    # grid sized for the GPU leaves most splits empty (batch 1 at 400 keys: 7 of 33).
    used_splits = tl.maximum(tl.cdiv(num_tiles - first_tile, tl.maximum(tiles_per_split, 1)), 1)
    writes_part = (split < used_splits) | (not MERGE_HERE)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_kpos = tile_lo * BLOCK_N + tl.arange(0, BLOCK_N)
    first_in_seq = (first_kpos < seq_len) & (tile_lo < tile_hi)
    if WINDOW:  # split 0's first tile may begin before the window; every later tile lies inside it
        first_in_seq = first_in_seq & (first_kpos >= seq_len - window)
    first_pages = tl.load(table + first_kpos // PAGE_SIZE, mask=first_in_seq, other=0).to(tl.int64)
    first_offsets = first_kpos % PAGE_SIZE
    # NOTE: only where the launcher says (reads_first_tile_early): holding the tile across the wait costs
    # registers, which grids of many programs an SM pay in occupancy.
    earlier = first_in_seq & (first_kpos < seq_len - FRESH_KEYS) & EARLY_FIRST_TILE
    k_first = load_kv_tile(k_cache_ptr, first_pages, first_offsets, kv_head, earlier, stride_kn, stride_kb,
                           stride_kh, HEAD_DIM, BLOCK_D, True, DOT_DTYPE)  # fmt: skip
    v_first = load_kv_tile(v_cache_ptr, first_pages, first_offsets, kv_head, earlier, stride_vn, stride_vb,
                           stride_vh, HEAD_DIM, BLOCK_D, True, DOT_DTYPE)  # fmt: skip
    pdl_wait(PDL)
    # NOTE: the newest positions' K/V come from this step's KV store (the kernel before): only now.
    newest = first_in_seq & ((first_kpos >= seq_len - FRESH_KEYS) | (not EARLY_FIRST_TILE))
    k_first = tl.where(newest[:, None], load_kv_tile(k_cache_ptr, first_pages, first_offsets, kv_head, newest,
                       stride_kn, stride_kb, stride_kh, HEAD_DIM, BLOCK_D, True, DOT_DTYPE), k_first)  # fmt: skip
    v_first = tl.where(newest[:, None], load_kv_tile(v_cache_ptr, first_pages, first_offsets, kv_head, newest,
                       stride_vn, stride_vb, stride_vh, HEAD_DIM, BLOCK_D, True, DOT_DTYPE), v_first)  # fmt: skip

    g = tl.arange(0, BLOCK_G)
    head = kv_head * GROUP + g  # [BLOCK_G]
    g_mask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_rows = seq.to(tl.int64) * stride_qs + head * stride_qh
    has_tiles = tile_lo < tile_hi
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=g_mask[:, None] & d_mask[None, :] & has_tiles, other=0.0)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    if has_tiles:
        acc, m_i, l_i = attend_tile(q, k_first, v_first, first_in_seq[None, :], acc, m_i, l_i, qk_scale, True, False,
                                    DOT_DTYPE, DOT_PRECISION)  # fmt: skip
    full_tiles = seq_len // BLOCK_N  # tiles with no key past seq_len: no key mask
    full_hi = tl.minimum(tile_hi, full_tiles)
    # NOTE: the loop is software-pipelined (LOOP_STAGES tiles in flight) only where the split walks at
    # least PIPELINE_MIN_TILES of them: the pipelined loop's set-up cost is most of a split of one or two
    # tiles, while long splits need the stages to keep reads in flight (decision 0019). See _attend_full_tiles.
    if full_hi - (tile_lo + 1) >= PIPELINE_MIN_TILES:
        acc, m_i, l_i = _attend_full_tiles(q, acc, m_i, l_i, tile_lo + 1, full_hi, k_cache_ptr, v_cache_ptr, table,
                                           kv_head, stride_kn, stride_kb, stride_kh, stride_vn, stride_vb, stride_vh,
                                           qk_scale, BLOCK_N, PAGE_SIZE, HEAD_DIM, BLOCK_D, DOT_DTYPE, DOT_PRECISION,
                                           LOOP_STAGES)  # fmt: skip
    else:
        acc, m_i, l_i = _attend_full_tiles(q, acc, m_i, l_i, tile_lo + 1, full_hi, k_cache_ptr, v_cache_ptr, table,
                                           kv_head, stride_kn, stride_kb, stride_kh, stride_vn, stride_vb, stride_vh,
                                           qk_scale, BLOCK_N, PAGE_SIZE, HEAD_DIM, BLOCK_D, DOT_DTYPE, DOT_PRECISION,
                                           1)  # fmt: skip
    # the last, partial tile (at most one: never pipelined)
    for tile in tl.range(tl.maximum(tile_lo + 1, full_tiles), tile_hi, num_stages=1):
        kpos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        in_seq = kpos < seq_len
        pages = tl.load(table + kpos // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
        offsets = kpos % PAGE_SIZE
        k = load_kv_tile(k_cache_ptr, pages, offsets, kv_head, in_seq, stride_kn, stride_kb, stride_kh,
                         HEAD_DIM, BLOCK_D, True, DOT_DTYPE)  # fmt: skip
        v = load_kv_tile(v_cache_ptr, pages, offsets, kv_head, in_seq, stride_vn, stride_vb, stride_vh,
                         HEAD_DIM, BLOCK_D, True, DOT_DTYPE)  # fmt: skip
        acc, m_i, l_i = attend_tile(q, k, v, in_seq[None, :], acc, m_i, l_i, qk_scale, True, False, DOT_DTYPE,
                                    DOT_PRECISION)  # fmt: skip

    # NOTE: an empty split (short sequence, many splits) has l = 0: it writes output 0
    # and lse -inf, which gives it weight 0 in the combine.
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    num_heads = GROUP * num_kv_heads
    if NUM_SPLITS == 1:
        out_rows = (seq * num_heads + head).to(tl.int64) * HEAD_DIM
        tl.store(out_ptr + out_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=g_mask[:, None] & d_mask[None, :])  # fmt: skip
    elif writes_part:
        part = (seq * num_heads + head).to(tl.int64) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(part_out_ptr + part[:, None] * BLOCK_D + d[None, :], out, mask=g_mask[:, None])
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=g_mask)
        if MERGE_HERE:
            # Every thread's partial stores come before the ticket (barrier), and the ticket
            # releases them to whichever program draws the last one (acq_rel at GPU scope).
            tl.debug_barrier()
            counter = counter_ptr + seq * num_kv_heads + kv_head
            ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if ticket == used_splits - 1:
                first_row = (seq * num_heads + kv_head * GROUP).to(tl.int64)
                merge_split_rows(part_out_ptr, part_lse_ptr, out_ptr, first_row, used_splits, HEAD_DIM, BLOCK_D,
                                 NUM_SPLITS, BLOCK_P, GROUP, BLOCK_GROUP, P_CHUNK)  # fmt: skip
                tl.atomic_xchg(counter, 0)  # ready for the next call


TILE_KEYS = ("BLOCK_N", "num_warps", "num_stages")


def _tile_config(head_dim: int, dtype: torch.dtype, tiles: dict | None) -> dict:
    """BLOCK_N keys per tile: 64 keys of 16-bit K and V (32 KB at D = 128) per pipeline stage.

    The decode step is bandwidth-bound, and this tile reads about as fast as the best of the swept
    shapes at every (B, L) (decision 0019). Fewer keys for
    fp32 and D = 256 (shared memory); 16 under the interpreter so that small test contexts
    cross tile and split borders. `tiles` overrides any of TILE_KEYS; num_stages is the stages of the
    long splits' key loop (PIPELINE_MIN_TILES), the kernel itself compiles with one.
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    if interpreting():
        config = dict(BLOCK_N=16, num_warps=4, num_stages=1)
    elif dtype == torch.float32 or block_d > 128:
        config = dict(BLOCK_N=32, num_warps=4, num_stages=2)
    else:
        config = dict(BLOCK_N=64, num_warps=4, num_stages=3)
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    return dict(config, **(tiles or {}), BLOCK_D=block_d)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    tiles: dict | None = None,
    merge: str | None = None,
    order: torch.Tensor | None = None,
    window: int | None = None,
    fresh_keys: int = 1,
) -> torch.Tensor:
    """Attention of one query per sequence q [S, Hq, D] over its paged K/V -> new tensor [S, Hq, D].

    window: the query sees its sequence's last `window` keys only; the splits share the key tiles from the
    one holding the window's first key on, and the tiles before it are never read. None: every key.

    num_splits overrides the context split count (tests and benchmarks); None picks it
    from the batch and the SM count. tiles overrides BLOCK_N, num_warps or num_stages.
    merge: where split parts are merged, "last_split" (the decode kernel's last program
    of each group) or "kernel" (a second kernel); see MERGES. None: choose_merge(D).
    order: [S] integer, a permutation of the sequences, longest context first (`length_order`): the
    grid takes them in that order, every KV head of a sequence together (wants_length_order says where
    the engine passes it). The output rows stay in the batch's order.
    fresh_keys: how many of each sequence's newest positions the kernels before this one may have written (its
    step's KV store), which a program reads only after the PDL wait: 1 for a decode step; 1 + k where a step
    verifying k proposed tokens runs them as decode rows of one sequence (engine/verify_rows.py), row j's keys
    L - 1 .. L - 1 + j all stored by that step.
    """
    if fresh_keys < 1:
        raise ValueError(f"fresh_keys must be >= 1, got {fresh_keys}")
    check_device(_decode_kernel, "q, k_cache, v_cache, block_tables and seq_lens",
                 q, k_cache, v_cache, block_tables, seq_lens)  # fmt: skip
    check_paged_kv(q, k_cache, v_cache, block_tables, seq_lens)
    check_window(window)
    num_seqs, num_heads, head_dim = q.shape
    if seq_lens.shape[0] != num_seqs:
        raise ValueError(f"seq_lens must have one entry per query ({num_seqs}), got {seq_lens.shape[0]}")
    num_kv_heads = k_cache.shape[2]
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, q.device)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if order is not None and (order.shape != (num_seqs,) or order.dtype not in (torch.int32, torch.int64)
                              or order.device != q.device):  # fmt: skip
        raise ValueError(f"order must be an integer [{num_seqs}] tensor on q's device, got {tuple(order.shape)} "
                         f"{order.dtype} on {order.device}")  # fmt: skip
    merge = choose_merge(head_dim) if merge is None else merge
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    group = num_heads // num_kv_heads
    config = _tile_config(head_dim, q.dtype, tiles)
    block_d = config["BLOCK_D"]
    block_p = triton.next_power_of_2(num_splits)
    if num_splits > 1:
        part_out = torch.empty((num_seqs, num_heads, num_splits, block_d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        counters = ticket_counters(num_seqs * num_kv_heads, q.device)
    else:
        part_out = part_lse = counters = out  # not read or written
    grid = (num_seqs * num_kv_heads, 1, num_splits) if order is not None else (num_seqs, num_kv_heads, num_splits)
    _decode_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, order if order is not None else seq_lens, out, part_out,
        part_lse, counters, scale * math.log2(math.e), window or 0, num_kv_heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        HEAD_DIM=head_dim, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_GROUP=triton.next_power_of_2(group), PAGE_SIZE=k_cache.shape[1], NUM_SPLITS=num_splits,
        BLOCK_P=block_p, P_CHUNK=merge_chunk(triton.next_power_of_2(group), block_d, block_p),
        MERGE_HERE=merge == "last_split",
        EARLY_FIRST_TILE=reads_first_tile_early(num_seqs, num_kv_heads, num_splits, q.device), FRESH_KEYS=fresh_keys,
        ORDERED=order is not None,
        DOT_DTYPE=dot_dtype(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_N=config["BLOCK_N"], BLOCK_D=block_d, LOOP_STAGES=config["num_stages"],
        PIPELINE_MIN_TILES=PIPELINE_MIN_TILES, WINDOW=window is not None, num_warps=config["num_warps"], num_stages=1,
        **pdl_options(q.device),
    )  # fmt: skip
    if num_splits > 1 and merge == "kernel":
        launch_merge(part_out, part_lse, out)
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q: [S, Hq, D] -> out [S, Hq, D]; decode is prefill with one query per sequence (window: the same)."""
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window)
