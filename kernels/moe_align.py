"""Token alignment for the grouped expert GEMMs: the (token, slot) pairs sorted by expert, each expert's
segment padded to the GEMM's row tile, on the device.

Legend: T = tokens, K = experts per token, P = T * K pairs (p = t * K + k), E = experts, M = BLOCK_M.
    moe_align(ids [T, K] int32, E, M) -> (sorted_ids [S] int32, block_experts [S / M] int32, num_padded [1] int32)
sorted_ids lists expert 0's pairs in pair order, then padding up to a multiple of M, then expert 1's, ...;
padding holds P (one past the last pair). block_experts[b] is the expert of rows b*M .. b*M + M - 1, -1 for
blocks at or past num_padded (the rows used). S = P + min(P, E) * (M - 1), rounded up to a multiple of M:
the most any routing can use (at most min(P, E) experts get pairs, each wastes at most M - 1 rows), so
every size follows T, K, E and M alone: no host sync, and a CUDA graph replays it for any routing.
Exact: integer counts and ranks; the order within an expert is the pairs' order, so the result is the
same on every run (the GEMMs' rows, and their bits, do not depend on which program ran first).

Kernels (three launches, each over fixed grids):
1. count: program c takes pairs c*CHUNK .. c*CHUNK + CHUNK - 1 and writes their histogram over experts
   to counts[c, :] (and fills a stripe of sorted_ids with the padding value);
2. offsets (one program): per expert, the exclusive prefix over chunks of the counts (where chunk c's
   pairs start within their expert's segment), the padded segment starts, num_padded and block_experts;
3. scatter: program c ranks its pairs within their expert inside the chunk (a cumulative sum of the
   one-hot [CHUNK, E] matrix) and writes each pair index to its segment's start + chunk offset + rank.
ids must lie in [0, E) (the router's are); a pair outside is skipped (memory-safe; its rows undefined).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_index, interpreting
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

MAX_EXPERTS = 1024
ONE_HOT_ELEMENTS = 8192  # CHUNK * BLOCK_E of the count and scatter programs
FILL_BLOCK = 1024
BLOCKS_AT_ONCE = 64  # blocks of block_experts the offsets program resolves at once


def align_sizes(num_pairs: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(S, S / M): the padded rows and blocks any routing of num_pairs pairs over num_experts can need."""
    rows = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    blocks = triton.cdiv(rows, block_m)
    return blocks * block_m, blocks


@triton.jit
def _count_kernel(
    ids_ptr,  # [P] int32
    counts_ptr,  # [C, BLOCK_E] int32
    sorted_ptr,  # [S] int32, filled with P here
    num_pairs,
    num_rows,  # S
    CHUNK: tl.constexpr,
    BLOCK_E: tl.constexpr,
    FILL: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    chunk = tl.program_id(0)
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    experts = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
    one_hot = (experts[:, None] == tl.arange(0, BLOCK_E)[None, :]).to(tl.int32)  # [CHUNK, BLOCK_E]
    tl.store(counts_ptr + chunk * BLOCK_E + tl.arange(0, BLOCK_E), tl.sum(one_hot, axis=0))
    for start in range(chunk * FILL, num_rows, tl.num_programs(0) * FILL):
        rows = start + tl.arange(0, FILL)
        tl.store(sorted_ptr + rows, tl.full([FILL], 0, tl.int32) + num_pairs, mask=rows < num_rows)


@triton.jit
def _offsets_kernel(
    counts_ptr,  # [C, BLOCK_E] int32
    offsets_ptr,  # [C, BLOCK_E] int32: where chunk c's pairs of expert e start within e's segment
    starts_ptr,  # [BLOCK_E] int32: each expert's first row
    block_experts_ptr,  # [S / M] int32
    num_padded_ptr,  # [1] int32
    num_chunks,
    num_experts,
    num_blocks,  # S / M
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    experts = tl.arange(0, BLOCK_E)
    totals = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c0 in range(0, num_chunks, BLOCK_C):
        chunks = c0 + tl.arange(0, BLOCK_C)
        where = chunks[:, None] * BLOCK_E + experts[None, :]
        mask = (chunks < num_chunks)[:, None]
        counts = tl.load(counts_ptr + where, mask=mask, other=0)  # [BLOCK_C, BLOCK_E]
        tl.store(offsets_ptr + where, tl.cumsum(counts, axis=0) - counts + totals[None, :], mask=mask)
        totals += tl.sum(counts, axis=0)
    padded = (totals + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(starts_ptr + experts, ends - padded)
    num_padded = tl.sum(padded, axis=0)
    tl.store(num_padded_ptr, num_padded)
    for b0 in range(0, num_blocks, BLOCK_B):
        blocks = b0 + tl.arange(0, BLOCK_B)
        first_row = blocks * BLOCK_M
        # the block's expert: the number of experts whose segment ends at or before its first row
        owner = tl.sum(((ends[None, :] <= first_row[:, None]) & (experts < num_experts)[None, :]).to(tl.int32), axis=1)
        tl.store(block_experts_ptr + blocks, tl.where(first_row < num_padded, owner, -1), mask=blocks < num_blocks)


@triton.jit
def _scatter_kernel(
    ids_ptr,  # [P] int32
    offsets_ptr,  # [C, BLOCK_E] int32
    starts_ptr,  # [BLOCK_E] int32
    sorted_ptr,  # [S] int32
    num_pairs,
    num_experts,
    CHUNK: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    chunk = tl.program_id(0)
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    experts = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
    valid = (pairs < num_pairs) & (experts >= 0) & (experts < num_experts)
    cols = tl.arange(0, BLOCK_E)
    one_hot = (experts[:, None] == cols[None, :]).to(tl.int32)  # [CHUNK, BLOCK_E]
    rank = tl.sum(tl.cumsum(one_hot, axis=0) * one_hot, axis=1) - 1  # earlier pairs of the chunk, same expert
    base = tl.load(offsets_ptr + chunk * BLOCK_E + cols) + tl.load(starts_ptr + cols)  # [BLOCK_E]
    rows = tl.sum(one_hot * base[None, :], axis=1) + rank
    tl.store(sorted_ptr + rows, pairs, mask=valid)


def align_chunk(num_experts: int) -> int:
    """Pairs per count/scatter program: a [CHUNK, E] one-hot of ONE_HOT_ELEMENTS (4 on the interpreter, so
    that the CPU tests' pairs span several chunks)."""
    if interpreting():
        return 4
    return max(16, ONE_HOT_ELEMENTS // triton.next_power_of_2(num_experts))


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids [S], block_experts [S / M], num_padded [1]), all int32 (see the module docstring).

    chunk overrides align_chunk (tests): a power of two.
    """
    check_device(_count_kernel, "ids", ids)
    check_index("ids", ids, 2)
    if ids.dtype != torch.int32 or not ids.is_contiguous():
        raise ValueError(f"ids must be a contiguous int32 [T, K] tensor, got {ids.dtype} strides {ids.stride()}")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"moe_align supports 1 to {MAX_EXPERTS} experts, got {num_experts}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    chunk = chunk or align_chunk(num_experts)
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    num_pairs = ids.numel()
    num_rows, num_blocks = align_sizes(num_pairs, num_experts, block_m)
    device = ids.device
    sorted_ids = torch.empty(num_rows, dtype=torch.int32, device=device)
    block_experts = torch.empty(num_blocks, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    if num_pairs == 0:
        return sorted_ids, block_experts, num_padded.zero_()
    block_e = triton.next_power_of_2(num_experts)
    num_chunks = triton.cdiv(num_pairs, chunk)
    counts = torch.empty(num_chunks, block_e, dtype=torch.int32, device=device)
    offsets = torch.empty_like(counts)
    starts = torch.empty(block_e, dtype=torch.int32, device=device)
    warps = 4 if chunk * block_e <= 4096 else 8
    _count_kernel[(num_chunks,)](
        ids, counts, sorted_ids, num_pairs, num_rows, CHUNK=chunk, BLOCK_E=block_e, FILL=FILL_BLOCK,
        num_warps=warps, **pdl_options(device),
    )  # fmt: skip
    block_c = max(1, min(triton.next_power_of_2(num_chunks), ONE_HOT_ELEMENTS // block_e))
    _offsets_kernel[(1,)](
        counts, offsets, starts, block_experts, num_padded, num_chunks, num_experts, num_blocks,
        BLOCK_M=block_m, BLOCK_C=block_c, BLOCK_E=block_e, BLOCK_B=BLOCKS_AT_ONCE, num_warps=8,
        **pdl_options(device),
    )  # fmt: skip
    _scatter_kernel[(num_chunks,)](
        ids, offsets, starts, sorted_ids, num_pairs, num_experts, CHUNK=chunk, BLOCK_E=block_e,
        num_warps=warps, **pdl_options(device),
    )  # fmt: skip
    return sorted_ids, block_experts, num_padded


def moe_align_ref(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_align in plain torch (host loops): the same three tensors, value for value."""
    num_pairs = ids.numel()
    num_rows, num_blocks = align_sizes(num_pairs, num_experts, block_m)
    flat = ids.reshape(-1).long().cpu()
    sorted_ids = torch.full((num_rows,), num_pairs, dtype=torch.int32)
    block_experts = torch.full((num_blocks,), -1, dtype=torch.int32)
    row = 0
    for expert in range(num_experts):
        pairs = torch.nonzero(flat == expert).flatten()
        sorted_ids[row : row + len(pairs)] = pairs.to(torch.int32)
        padded = -(-len(pairs) // block_m) * block_m
        block_experts[row // block_m : (row + padded) // block_m] = expert
        row += padded
    device = ids.device
    return sorted_ids.to(device), block_experts.to(device), torch.tensor([row], dtype=torch.int32, device=device)
