"""Greedy sampling: each row's argmax and whether the row is all finite, in one kernel.

Legend: S = rows (sequences that sample this step), V = vocabulary, C = chunks per row.
logits [S, V] (any float dtype, last dim contiguous) -> [2, S] int64: row 0 the token
ids (the first index of the row's maximum, as torch.argmax), row 1 1 where every logit
of the row is finite, else 0. Packed so that the caller's one .tolist() is the step's
one host sync. Exact (no arithmetic beyond comparisons). A row holding a NaN gets an
arbitrary token id and finite 0: the engine reports it as an error, never samples it.

masked=True: the logits went through a grammar's token bitmask (kernels/token_bitmask.py) first, so -inf
is a forbidden token, not a fault; a row is then bad where it holds a NaN or +inf, or no finite logit.

Why: torch's argmax and the sum that checks finiteness are each one thread block per
row, so at batch 1 over a 128k vocabulary one SM reads the whole row twice; this kernel spreads
the row over many programs and reads it once (decision 0006).

Kernel: grid (S, C); program (s, c) reduces its BLOCK_V-wide chunks of row s to
(max, first argmax, non-finite count), stores them, takes a ticket from the row's
counter, and the program with the last ticket merges the C partial results (lowest
index wins ties) and puts the counter back to 0 (the decode kernel's merge pattern).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, interpreting, num_sms, ticket_counters
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

BLOCK_V = 2048
MAX_CHUNKS = 128


@triton.jit
def fold_argmax(x, idx, valid, best, best_idx, bad, MASKED: tl.constexpr):
    """Folds one tile of a row into per-lane (max, first index of the max, count of faulty logits: NaN and
    infinities, or NaN and +inf only when MASKED)."""
    if MASKED:
        bad += (((x != x) | (x == float("inf"))) & valid).to(tl.int32)
    else:
        bad += (((x != x) | (tl.abs(x) == float("inf"))) & valid).to(tl.int32)
    better = x > best  # strict: an earlier column keeps a tie
    return tl.where(better, x, best), tl.where(better, idx, best_idx), bad


@triton.jit
def first_argmax(best, best_idx):
    """(max, its lowest index) of per-lane (value, index) pairs (index 2**31 - 1 when every value is -inf or NaN)."""
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_idx, 2**31 - 1), axis=0)


# NOTE: the row count and chunk count are run-time arguments, never constexprs: they change
# with the batch from step to step, and a constexpr per value recompiles the kernel inside served
# steps (decisions 0006, 0009).
@triton.jit(do_not_specialize=["num_rows", "num_chunks"])
def _greedy_kernel(
    logits_ptr,  # [S, V]
    part_max_ptr,  # [S, C] fp32
    part_idx_ptr,  # [S, C] int32
    part_bad_ptr,  # [S, C] int32
    counter_ptr,  # [>= S] int32, zero between calls
    out_ptr,  # [2, S] int64
    num_rows,
    num_chunks,  # C
    vocab,
    stride_row,
    BLOCK_C: tl.constexpr,  # MAX_CHUNKS: one compiled variant for every C
    BLOCK_V: tl.constexpr,
    MASKED: tl.constexpr,  # -inf is a masked token (the module's docstring)
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # nothing here reads weights before its first dependent load (kernels/_pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base = logits_ptr + row.to(tl.int64) * stride_row
    cols = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_V], 2**31 - 1, tl.int32)
    bad = tl.zeros([BLOCK_V], tl.int32)
    # this program's columns: chunk, chunk + CHUNKS, ... in BLOCK_V tiles (coalesced, balanced)
    for start in range(chunk * BLOCK_V, vocab, num_chunks * BLOCK_V):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        best, best_idx, bad = fold_argmax(x, idx, idx < vocab, best, best_idx, bad, MASKED)
    chunk_max, chunk_idx = first_argmax(best, best_idx)
    part = row * num_chunks + chunk
    tl.store(part_max_ptr + part, chunk_max)
    tl.store(part_idx_ptr + part, chunk_idx)
    tl.store(part_bad_ptr + part, tl.sum(bad, axis=0))
    tl.debug_barrier()  # every thread's stores before the ticket (which releases them)
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if ticket == num_chunks - 1:
        c = tl.arange(0, BLOCK_C)
        c_mask = c < num_chunks
        maxes = tl.load(part_max_ptr + row * num_chunks + c, mask=c_mask, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(part_idx_ptr + row * num_chunks + c, mask=c_mask, other=2**31 - 1, cache_modifier=".cg")
        bads = tl.load(part_bad_ptr + row * num_chunks + c, mask=c_mask, other=0, cache_modifier=".cg")
        top, token = first_argmax(maxes, idxs)
        token = tl.where(token == 2**31 - 1, 0, token)  # an all -inf / NaN row: no max; it is flagged below
        finite = tl.sum(bads, axis=0) == 0
        if MASKED:
            finite = finite & (top > float("-inf"))
        tl.store(out_ptr + row, token.to(tl.int64))
        tl.store(out_ptr + num_rows + row, finite.to(tl.int64))
        tl.atomic_xchg(counter_ptr + row, 0)  # ready for the next call


def choose_chunks(num_rows: int, vocab: int, device: torch.device) -> int:
    """Programs per row: about two per SM over the whole batch, at most one per BLOCK_V columns."""
    if interpreting() or device.type != "cuda":
        return min(3, triton.cdiv(vocab, BLOCK_V))  # crosses chunk borders in the CPU tests
    return max(1, min(MAX_CHUNKS, triton.cdiv(vocab, BLOCK_V), triton.cdiv(2 * num_sms(device), num_rows)))


def check_logits(logits: torch.Tensor) -> None:
    """What the sampling launchers take: [S, V] float logits, V > 0, contiguous along V."""
    check_float("logits", logits)
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be [S, V] with V > 0, got shape {tuple(logits.shape)}")
    if logits.stride(1) != 1:
        raise ValueError(f"logits must be contiguous in its last dim, got strides {logits.stride()}")


def row_chunks(num_rows: int, vocab: int, device: torch.device, chunks: int | None) -> int:
    """The programs per row: choose_chunks's, or `chunks` (tests) when it fits the vocabulary."""
    chunks = chunks or choose_chunks(num_rows, vocab, device)
    most = min(MAX_CHUNKS, triton.cdiv(vocab, BLOCK_V))
    if not 1 <= chunks <= most:
        raise ValueError(f"chunks must be in [1, {most}] for V = {vocab}, got {chunks}")
    return chunks


def greedy_sample(logits: torch.Tensor, *, masked: bool = False, chunks: int | None = None) -> torch.Tensor:
    """[S, V] logits -> [2, S] int64: (argmax per row, 1 if the row is all finite else 0).

    masked: -inf marks a token a grammar forbids (the module's docstring). chunks overrides the programs per
    row (tests)."""
    check_device(_greedy_kernel, "logits", logits)
    check_logits(logits)
    num_rows, vocab = logits.shape
    out = torch.empty((2, num_rows), dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    chunks = row_chunks(num_rows, vocab, logits.device, chunks)
    part_max = torch.empty((num_rows, chunks), dtype=torch.float32, device=logits.device)
    part_idx = torch.empty((num_rows, chunks), dtype=torch.int32, device=logits.device)
    part_bad = torch.empty((num_rows, chunks), dtype=torch.int32, device=logits.device)
    _greedy_kernel[(num_rows, chunks)](
        logits, part_max, part_idx, part_bad, ticket_counters(num_rows, logits.device), out,
        num_rows, chunks, vocab, logits.stride(0),
        BLOCK_C=MAX_CHUNKS, BLOCK_V=BLOCK_V, MASKED=masked, num_warps=8, **pdl_options(logits.device),
    )  # fmt: skip
    return out


def greedy_sample_ref(logits: torch.Tensor, masked: bool = False) -> torch.Tensor:
    """[S, V] -> [2, S] int64: (argmax, all finite) per row; masked as greedy_sample's.

    NOTE: a row is all finite iff its sum is (a NaN or an infinity anywhere makes the sum
    non-finite; the logits of a real model are far from overflowing an fp32 sum, which 16-bit logits get
    too: an fp16 sum of a vocabulary's logits can overflow). On the CPU, the engine's path there,
    isfinite over every logit costs far more than the sum (decision 0006).
    """
    if masked:
        return torch.stack((logits.argmax(dim=-1), masked_rows_finite(logits).to(torch.int64)))
    finite = torch.isfinite(logits.sum(dim=-1, dtype=torch.float32))
    return torch.stack((logits.argmax(dim=-1), finite.to(torch.int64)))


def masked_rows_finite(logits: torch.Tensor) -> torch.Tensor:
    """[S, V] -> [S] bool: the row holds no NaN or +inf and some finite logit (-inf: a token a grammar's mask
    forbids). A sum with the -inf taken out is finite exactly then (the non-masked sum's argument)."""
    kept = logits.float().masked_fill(logits == float("-inf"), 0.0)
    return torch.isfinite(kept.sum(dim=-1)) & (logits.amax(dim=-1) > float("-inf"))
