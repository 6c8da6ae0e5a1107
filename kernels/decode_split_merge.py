"""The merge of flash-decoding's split parts: each split of a sequence's context left a normalized
partial output and its log-sum-exp; the output is their softmax-weighted sum.

Legend: S = sequences, Hq = query heads, P = splits, D = head dim (BLOCK_D padded), lse in log2 units.
Math: out[s, h] = sum_p w_p part[s, h, p] / sum_p w_p with w_p = exp2(lse[s, h, p] - max_p lse[s, h, p]);
a part of lse -inf (a split without keys) weighs 0, and a row whose parts are all -inf gets 0.
Precision contract: fp32 parts; the output within one rounding of its dtype of the fp32 sum.

Two places run it (kernels/decode_attention.py): the decode kernel's last split of each (sequence,
KV head), through `merge_split_rows`, or `_merge_splits_kernel` after the decode kernel, one program a
(sequence, query head). `choose_merge` picks one by head dim, from H100 and H200 measurements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

MERGES = ("last_split", "kernel")
DEFAULT_MERGE: str | None = None  # None: choose_merge's rule; one of MERGES forces it (benchmark A/Bs)
KERNEL_MERGE_MAX_HEAD_DIM = 128  # measured up to 128 (H100 and H200); D = 256 unmeasured keeps the last split
# One warp a (sequence, query head): its chunk of at most 4096 parts' elements (merge_chunk) is 128
# registers a thread, reduced over the splits without shared memory and without spills at D = 64 or 128
# (bench.compile_check); 2 or 4 warps made the decode step slower (decision 0018).
MERGE_KERNEL_WARPS = 1


@triton.jit
def merge_split_rows(
    part_out_ptr,  # [S, Hq, P, BLOCK_D] fp32
    part_lse_ptr,  # [S, Hq, P] fp32, log2 domain
    out_ptr,  # [S, Hq, D] contiguous
    first_row,  # sequence * Hq + first query head of the rows
    num_parts,  # the rows' parts 0..num_parts-1 are merged (the splits that hold keys)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,  # ROWS padded to a power of two
    P_CHUNK: tl.constexpr,  # splits per load; the chunks are unrolled, so their loads overlap
):
    """out[r] = sum_p exp2(lse_p - max lse) part_p / sum_p exp2(lse_p - max lse) for ROWS rows.

    NOTE: .cg loads read the parts from L2, never from this SM's L1, which may hold
    lines of an earlier call's parts."""
    r = tl.arange(0, BLOCK_ROWS)
    rows = first_row + r  # [R]
    r_mask = (r < ROWS)[:, None]
    p = tl.arange(0, BLOCK_P)
    lse = tl.load(part_lse_ptr + rows[:, None] * NUM_SPLITS + p[None, :], mask=r_mask & (p < num_parts)[None, :],
                  other=float("-inf"), cache_modifier=".cg")  # fmt: skip
    lse_max = tl.max(lse, axis=1)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # all splits empty: weights 0, not NaN
    total = tl.sum(tl.exp2(lse - lse_max[:, None]), axis=1)  # [R]
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_D], tl.float32)
    for c in tl.static_range(0, BLOCK_P, P_CHUNK):
        pc = c + tl.arange(0, P_CHUNK)
        chunk_mask = r_mask & (pc < num_parts)[None, :]  # [R, C]
        part = rows[:, None] * NUM_SPLITS + pc[None, :]  # [R, C]
        lse_c = tl.load(part_lse_ptr + part, mask=chunk_mask, other=float("-inf"), cache_modifier=".cg")
        parts = tl.load(part_out_ptr + (part * BLOCK_D)[:, :, None] + d[None, None, :], mask=chunk_mask[:, :, None],
                        other=0.0, cache_modifier=".cg")  # fmt: skip
        acc += tl.sum(parts * tl.exp2(lse_c - lse_max[:, None])[:, :, None], axis=1)
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + rows[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=r_mask & (d < HEAD_DIM)[None, :])  # fmt: skip


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,  # [S, Hq, P, BLOCK_D] fp32
    part_lse_ptr,  # [S, Hq, P] fp32, log2 domain
    out_ptr,  # [S, Hq, D] contiguous
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    P_CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    """merge="kernel": one program per (sequence, query head) after the decode kernel."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # nothing here reads weights before its first dependent load (kernels/_pdl.py)
    merge_split_rows(part_out_ptr, part_lse_ptr, out_ptr, tl.program_id(0).to(tl.int64), NUM_SPLITS, HEAD_DIM,
                     BLOCK_D, NUM_SPLITS, BLOCK_P, 1, 1, P_CHUNK)  # fmt: skip


def choose_merge(head_dim: int) -> str:
    """Where split parts are merged: a second kernel at head dims up to KERNEL_MERGE_MAX_HEAD_DIM,
    the last split above (DEFAULT_MERGE, when set, instead).

    The last split's merge costs its kernel a ticket and a read of the parts from L2 in one program a group;
    the second kernel, on one warp, gave the faster decode step at D = 64 and 128 on the H100 and the H200
    (decision 0018). D = 256 is unmeasured and keeps the last split.
    """
    if DEFAULT_MERGE is not None:
        return DEFAULT_MERGE
    return "kernel" if head_dim <= KERNEL_MERGE_MAX_HEAD_DIM else "last_split"


def merge_chunk(rows: int, block_d: int, block_p: int) -> int:
    """Splits per merge load: 4096 fp32 elements (32 registers a thread in the decode kernel's 4 warps,
    128 in the merge kernel's one, MERGE_KERNEL_WARPS)."""
    return max(1, min(block_p, 4096 // (rows * block_d)))


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Merges part_out [S, Hq, P, BLOCK_D] fp32 by part_lse [S, Hq, P] fp32 (log2 units) into out
    [S, Hq, D] (contiguous; D <= BLOCK_D): the second kernel of merge="kernel"."""
    check_device(_merge_splits_kernel, "part_out, part_lse and out", part_out, part_lse, out)
    num_seqs, num_heads, num_splits, block_d = part_out.shape
    head_dim = out.shape[-1]
    if part_out.dtype != torch.float32 or part_lse.dtype != torch.float32:
        raise ValueError(f"part_out and part_lse must be float32, got {part_out.dtype} and {part_lse.dtype}")
    if part_lse.shape != (num_seqs, num_heads, num_splits) or out.shape[:2] != (num_seqs, num_heads):
        raise ValueError(
            f"part_lse {tuple(part_lse.shape)} and out {tuple(out.shape)} must match part_out "
            f"{tuple(part_out.shape)} as [S, Hq, P] and [S, Hq, D]"
        )
    if head_dim > block_d or block_d != triton.next_power_of_2(block_d):
        raise ValueError(f"part_out's last dim ({block_d}) must be a power of two holding D = {head_dim}")
    if not (part_out.is_contiguous() and part_lse.is_contiguous() and out.is_contiguous()):
        raise ValueError("part_out, part_lse and out must be contiguous")
    launch_merge(part_out, part_lse, out)


def launch_merge(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """merge_splits without its checks: for kernels/decode_attention.py, which made these buffers itself
    (no second round of checks on the decode step's host path)."""
    num_seqs, num_heads, num_splits, block_d = part_out.shape
    head_dim = out.shape[-1]
    block_p = triton.next_power_of_2(num_splits)
    _merge_splits_kernel[(num_seqs * num_heads,)](
        part_out, part_lse, out,
        HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits, BLOCK_P=block_p,
        P_CHUNK=merge_chunk(1, block_d, block_p), num_warps=MERGE_KERNEL_WARPS, **pdl_options(out.device),
    )  # fmt: skip


def merge_splits_ref(part_out: torch.Tensor, part_lse: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[S, Hq, P, BLOCK_D], [S, Hq, P] -> out [S, Hq, D] float32, the formula above in torch."""
    lse_max = part_lse.amax(dim=-1, keepdim=True)
    lse_max = torch.where(lse_max == float("-inf"), torch.zeros_like(lse_max), lse_max)
    weights = torch.exp2(part_lse - lse_max)  # [S, Hq, P]
    total = weights.sum(dim=-1, keepdim=True)
    merged = (weights.unsqueeze(-1) * part_out).sum(dim=-2) / torch.where(total > 0, total, torch.ones_like(total))
    return merged[..., :head_dim]
