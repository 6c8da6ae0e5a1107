"""The k-th largest of x = logits / temperature in a row: what top-k keeps (kernels/random_sample.py).

Radix select on the float's bits made order-preserving (`_ordered`), 8 bits at a time from the top:
count the row's values per digit value, pick the digit where the count from the top reaches the
rank still wanted, and keep only that digit's values for the next digit; after four digits the
prefix is the k-th largest value exactly (ties included: the k-th value of the sorted row).

- `kth_largest`: one program over a whole row (random_sample's single-program path).
- `_radix_pass_kernel`: the same over a row's C shares in programs (s, c), one launch a digit; each
  program counts its share, the last of a row (a ticket, greedy_sample's pattern) adds the C
  histograms and picks the digit. Four launches, because every digit needs the ones before it.
  At batch 1 over a 128k vocabulary that is 63 programs a pass against one SM reading the row four
  times (decision 0004).

Precision contract: exact (integer counts over the fp32 values the race reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, ticket_counters
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.greedy_sample import BLOCK_V, check_logits, row_chunks

NUM_WARPS = 8


@triton.jit
def _ordered(x):
    """fp32 -> uint32 whose unsigned order is the floats' order (negative floats flipped whole)."""
    bits = x.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return bits ^ flip


@triton.jit
def _from_ordered(key):
    flip = tl.where((key >> 31) == 1, 0x80000000, 0xFFFFFFFF).to(tl.uint32)
    return (key ^ flip).to(tl.float32, bitcast=True)


@triton.jit
def _digit_counts(base, first, vocab, step, inv_temp, prefix, DIGIT: tl.constexpr, BLOCK_V: tl.constexpr):
    """The 256 counts of digit DIGIT (0 = the top 8 bits) of _ordered(x) over the tiles of BLOCK_V tokens at
    first, first + step, ... below vocab, among the values whose higher digits are `prefix`."""
    shift: tl.constexpr = 24 - 8 * DIGIT
    cols = tl.arange(0, BLOCK_V)
    counts = tl.zeros([256], tl.int32)
    for start in range(first, vocab, step):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < vocab, other=0.0).to(tl.float32) * inv_temp
        key = _ordered(x)
        if DIGIT == 0:
            match = idx < vocab
        else:
            match = (idx < vocab) & ((key >> (shift + 8)) == prefix)
        counts += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
    return counts


@triton.jit
def _pick_digit(counts, prefix, remaining):
    """The digit holding the `remaining`-th largest value (counting from the top), appended to `prefix`,
    and the rank left inside it."""
    bins = tl.arange(0, 256)
    at_or_above = tl.sum(counts) - tl.cumsum(counts, axis=0) + counts  # values whose digit is >= b
    b = tl.max(tl.where(at_or_above >= remaining, bins, 0))
    remaining -= tl.sum(tl.where(bins > b, counts, 0))
    return (prefix << 8) | b.to(tl.uint32), remaining


@triton.jit
def kth_largest(base, vocab, k, inv_temp, BLOCK_V: tl.constexpr):
    """The k-th largest of x = logits * inv_temp over the row (k >= 1), by radix select on _ordered(x)."""
    prefix = tl.zeros([], tl.uint32)
    remaining = k
    for digit in tl.static_range(4):
        counts = _digit_counts(base, 0, vocab, BLOCK_V, inv_temp, prefix, digit, BLOCK_V)
        prefix, remaining = _pick_digit(counts, prefix, remaining)
    return _from_ordered(prefix)


@triton.jit
def takes_top_k(temperature, top_k, vocab):
    """Whether step 0 gives this row its k-th largest x: a sampled row with 1 <= top_k < V."""
    return (temperature > 0) & (top_k > 0) & (top_k < vocab)


# NOTE: the row and chunk counts are run-time arguments, never constexprs (greedy_sample.py says why).
@triton.jit(do_not_specialize=["num_rows", "num_chunks"])
def _radix_pass_kernel(
    logits_ptr,  # [S, V]
    params_ptr,  # [5, S] fp64
    hist_ptr,  # [S, C, 256] int32: each share's counts of this pass's digit
    select_ptr,  # [2, S] int64: the digits chosen so far (as _ordered's high bits) and the rank left
    kth_ptr,  # [S] fp32: the row's k-th largest x, written by the last pass
    counter_ptr,  # [>= S] int32, zero between calls
    num_rows,
    num_chunks,
    vocab,
    stride_row,
    BLOCK_V: tl.constexpr,
    DIGIT: tl.constexpr,  # 0 (the top 8 bits of _ordered(x)) to 3
    PDL: tl.constexpr,
):
    """Step 0, pass DIGIT: radix select of the row's k-th largest x (as kth_largest), each pass's digit
    histogram counted over the row's C shares in programs (s, c); the last program of a row adds them up
    and picks the digit. Four launches: each pass needs the digits before it."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the logits come from the kernel before (the previous pass's digits too)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temperature = tl.load(params_ptr + row).to(tl.float32)  # pack_params's rows 0 and 1
    top_k = tl.load(params_ptr + num_rows + row).to(tl.int32)
    if not takes_top_k(temperature, top_k, vocab):
        return  # every program of such a row returns: none takes a ticket
    inv_temp = 1.0 / temperature
    if DIGIT == 0:
        prefix = tl.zeros([], tl.uint32)
        remaining = top_k
    else:
        prefix = tl.load(select_ptr + row).to(tl.uint32)
        remaining = tl.load(select_ptr + num_rows + row).to(tl.int32)
    base = logits_ptr + row.to(tl.int64) * stride_row
    counts = _digit_counts(base, chunk * BLOCK_V, vocab, num_chunks * BLOCK_V, inv_temp, prefix, DIGIT, BLOCK_V)
    bins = tl.arange(0, 256)
    part = (row * num_chunks + chunk).to(tl.int64) * 256
    tl.store(hist_ptr + part + bins, counts)
    tl.debug_barrier()  # every thread's stores before the ticket (which releases them)
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if ticket == num_chunks - 1:
        c = tl.arange(0, 8)
        total = tl.zeros([256], tl.int32)
        for first in range(0, num_chunks, 8):
            parts = (row * num_chunks + first + c).to(tl.int64) * 256
            total += tl.sum(tl.load(hist_ptr + parts[:, None] + bins[None, :], mask=(first + c < num_chunks)[:, None],
                                    other=0, cache_modifier=".cg"), axis=0)  # fmt: skip
        prefix, remaining = _pick_digit(total, prefix, remaining)
        if DIGIT == 3:
            tl.store(kth_ptr + row, _from_ordered(prefix))
        else:
            tl.store(select_ptr + row, prefix.to(tl.int64))
            tl.store(select_ptr + num_rows + row, remaining.to(tl.int64))
        tl.atomic_xchg(counter_ptr + row, 0)  # ready for the next pass


def top_k_thresholds_on(
    logits: torch.Tensor, params: torch.Tensor, chunks: int, counters: torch.Tensor
) -> torch.Tensor:
    """Step 0 of kernels/random_sample.py on `counters` (zero; left zero): [S] fp32, the k-th largest x
    of each row takes_top_k takes (other rows' entries are not written)."""
    num_rows, vocab = logits.shape
    hist = torch.empty((num_rows, chunks, 256), dtype=torch.int32, device=logits.device)
    select = torch.empty((2, num_rows), dtype=torch.int64, device=logits.device)
    kth = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    for digit in range(4):
        _radix_pass_kernel[(num_rows, chunks)](
            logits, params, hist, select, kth, counters, num_rows, chunks, vocab, logits.stride(0),
            BLOCK_V=BLOCK_V, DIGIT=digit, num_warps=NUM_WARPS, **pdl_options(logits.device),
        )  # fmt: skip
    return kth


def top_k_thresholds(logits: torch.Tensor, params: torch.Tensor, *, chunks: int | None = None) -> torch.Tensor:
    """Step 0 alone (tests): [S] fp32, each row's k-th largest logits / temperature where 1 <= top_k < V
    and the row samples; NaN elsewhere."""
    check_device(_radix_pass_kernel, "logits and params", logits, params)
    check_logits(logits)
    num_rows, vocab = logits.shape
    chunks = row_chunks(num_rows, vocab, logits.device, chunks)
    kth = top_k_thresholds_on(logits, params, chunks, ticket_counters(num_rows, logits.device))
    temperature, top_k = params[0], params[1]
    taken = (temperature > 0) & (top_k > 0) & (top_k < vocab)
    return torch.where(taken, kth, float("nan"))
