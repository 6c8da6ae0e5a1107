"""Seeded random sampling with temperature, top-k, top-p and min-p, without sorting the vocabulary.

Legend: S = rows (sequences that sample this step), V = vocabulary, C = chunks per row.
    logits [S, V], params [5, S] fp64 (temperature, top_k, top_p, min_p, key) -> [2, S] int64:
    row 0 the token ids, row 1 1 where every logit of the row is finite, else 0 (greedy_sample's
    packing, so the engine reads both with its step's one copy).

Math (engine/torch_sampling.py computes it by sorting: the engine's torch path and this kernel's reference):
x = logits / temperature; the kept set K is
    top-k:  the k largest x (k = 0: every token),
    top-p:  tokens whose strictly larger tokens hold less than top_p of the probability mass
            (softmax over the top-k set), the largest always kept,
    min-p:  tokens with p >= min_p * p_max, i.e. x >= max(x) + log(min_p);
and the token is the exponential race argmax_{v in K} p_v / E_v, E_v = -log(u_v) with u_v the
counter hash of (key, v). As argmax_v (x_v - log E_v) the race needs neither the softmax nor the
sort. Each filter keeps the tokens above a threshold, so if the race's winner w over all tokens lies
in K, it is K's winner; if it does not, no token at or below x_w does either.

Kernels: grid (S, C), each program one strided share of a row, the last of a row (a ticket
from an atomic counter, greedy_sample's pattern) merging the shares:
    0. only when a row has top-k and top-p (asks_step_0) and a row has more than one program:
       kernels/top_k_select.py's `_radix_pass_kernel` four times, the k-th
       largest x (8-bit digits; each pass's histograms counted over the shares, the digit picked by
       the last program). The race and the softmax of such a row then run over x >= that value only,
       so top-k never refuses a winner, and top-k with top-p needs no single-program path.
    1. `_race_kernel`: max and first argmax (greedy), finiteness, the softmax's max and denominator
       (online), and the race over every token. Temperature alone, greedy and bad rows end here.
    2. `_check_kernel`: for rows with top-k or top-p, the count and the mass of the tokens above x_w;
       w is kept when fewer than k are larger and they hold less than top_p of the mass. A winner
       outside K (about 1 row in 20 at top_p = 0.95: the mass outside the nucleus) goes to
       `_sample_row`: one program runs the rest, racing above each refused winner (with step 0's k-th
       value; without step 0, select_top_k=False, it finds it by the same radix select alone, and
       top-k with top-p always goes there).
Temperature 0 is greedy (the first argmax, as torch.argmax). A row with a non-finite logit gets
token 0 and finite 0: the engine reports it as an error and never uses the token. masked=True (logits a
grammar's bitmask went over first): -inf is a forbidden token, and only NaN, +inf or a row without a finite
logit is bad (greedy_sample's masked).

Precision contract: the same token as the reference except where two candidates' scores are
within float rounding of each other (the race compares x - log E instead of p / E, and exp and
log differ by an ulp between libraries), or where the reference breaks ties by sort order: it
keeps exactly k of several tokens tied at the k-th value, and cuts the nucleus inside a run of
equal probabilities; here ties at the k-th value all stay, and equal tokens are in or out together.

Why: the torch path is ~40-60 small torch operations a sampled step (a sort of the whole vocabulary
among them), each a launch from Python; at batch 1 a small model's sampled step was host-bound
(decision 0004).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, ticket_counters
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.greedy_sample import BLOCK_V, MAX_CHUNKS, check_logits, first_argmax, fold_argmax, row_chunks
from kernels.top_k_select import kth_largest, takes_top_k, top_k_thresholds_on

NUM_WARPS = 8
PARAM_ROWS = ("temperature", "top_k", "top_p", "min_p", "key")


@triton.jit
def _mix32(x):
    """engine.torch_sampling.mix32 on uint32 (its int64 products masked to 32 bits are these wrapping ones)."""
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def _race_score(x, idx, key):
    """x - log(E) with E = -log(u), u the (key, token id) uniform: the log of p / E up to a row constant."""
    h = _mix32(key + idx.to(tl.uint32) * 0x9E3779B)  # token id x the hash's odd step (uniform_from_keys)
    u = tl.minimum(((h >> 8).to(tl.float32) + 0.5) / 16777216.0, 0.99999994)  # uniform_from_keys: below 1
    return x - tl.log(-tl.log(u))


@triton.jit
def _sample_row(base, vocab, inv_temp, top_k, top_p, min_p, key, x_max, above, kth, kth_known,
                BLOCK_V: tl.constexpr):  # fmt: skip
    """The whole row in one program (the module docstring's single-program path), the races starting above `above`
    (exclusive; a winner known to be outside the kept set, or -inf). The rare path: a rejected winner, or
    top-k with top-p, whose nucleus needs the top-k set's exact mass. `kth`: the k-th largest x when
    `kth_known` (from step 0), else found here."""
    cols = tl.arange(0, BLOCK_V)
    lower = tl.full([], float("-inf"), tl.float32)  # inclusive bound: top-k and min-p
    if top_k > 0 and top_k < vocab:
        if kth_known:
            lower = kth
        else:
            lower = kth_largest(base, vocab, top_k, inv_temp, BLOCK_V)
    if min_p > 0:
        lower = tl.maximum(lower, x_max + tl.log(min_p))
    nucleus = top_p < 1.0
    mass = tl.zeros([], tl.float32)
    if nucleus:  # the softmax's denominator over the top-k set
        z = tl.zeros([BLOCK_V], tl.float32)
        for start in range(0, vocab, BLOCK_V):
            idx = start + cols
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
            z += tl.where(x >= lower, tl.exp(x - x_max), 0.0)
        mass = top_p * tl.sum(z)
    token = tl.zeros([], tl.int32)
    searching = True
    while searching:
        race = tl.full([BLOCK_V], float("-inf"), tl.float32)
        race_idx = tl.full([BLOCK_V], 2**31 - 1, tl.int32)
        for start in range(0, vocab, BLOCK_V):
            idx = start + cols
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
            score = tl.where((x >= lower) & (x > above) & (idx < vocab), _race_score(x, idx, key), float("-inf"))
            better = score > race
            race = tl.where(better, score, race)
            race_idx = tl.where(better, idx, race_idx)
        _, token = first_argmax(race, race_idx)
        searching = False
        if nucleus:
            x_won = tl.load(base + token).to(tl.float32) * inv_temp
            larger = tl.zeros([BLOCK_V], tl.float32)
            for start in range(0, vocab, BLOCK_V):
                idx = start + cols
                x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
                larger += tl.where(x > x_won, tl.exp(x - x_max), 0.0)  # all above the bounds: x_won is
            if tl.sum(larger) >= mass:
                above = x_won
                searching = True
    return token


# Row state the first kernel leaves for the second ([4, S] fp32 after the partials): what the row needs
# next, the max and softmax denominator of x, and the race winner's x.
DONE = tl.constexpr(0)  # the token is written
CHECK = tl.constexpr(1)  # check the race's winner against top-k and top-p
ALONE = tl.constexpr(2)  # one program runs _sample_row


@triton.jit
def _load_params(params_ptr, num_rows, row):
    temperature = tl.load(params_ptr + row).to(tl.float32)
    top_k = tl.load(params_ptr + num_rows + row).to(tl.int32)
    top_p = tl.load(params_ptr + 2 * num_rows + row).to(tl.float32)
    min_p = tl.load(params_ptr + 3 * num_rows + row).to(tl.float32)
    key = tl.load(params_ptr + 4 * num_rows + row).to(tl.int64).to(tl.uint32)
    return temperature, top_k, top_p, min_p, key


@triton.jit(do_not_specialize=["num_rows", "num_chunks"])
def _race_kernel(
    logits_ptr,  # [S, V]
    params_ptr,  # [5, S] fp64: temperature (0: greedy), top_k (0: off), top_p (1: off), min_p (0: off), key
    work_ptr,  # fp32: [7, S, C] partials, then [4, S] row state
    counter_ptr,  # [>= S] int32, zero between calls
    packed_ptr,  # [2, S] int64
    kth_ptr,  # [S] fp32 from step 0 (read when HAS_KTH)
    num_rows,
    num_chunks,  # C
    vocab,
    stride_row,
    BLOCK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_KTH: tl.constexpr,  # step 0 ran before
    MASKED: tl.constexpr,  # -inf is a masked token (the module's docstring)
    PDL: tl.constexpr,
):
    """Step 1 and the race over every token (over x >= the k-th largest for rows step 0 took), chunk c of
    row s in program (s, c); the last program of a row merges the chunks, writes the token of a row that
    needs nothing more and the row's state."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the logits come from the kernel before; nothing here is a weight
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temperature, top_k, top_p, min_p, key = _load_params(params_ptr, num_rows, row)
    sampled = temperature > 0
    inv_temp = 1.0 / tl.where(sampled, temperature, 1.0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    lower = tl.full([], float("-inf"), tl.float32)  # the kept set's bound from step 0 (inclusive)
    kth_known = False
    if HAS_KTH:
        kth_known = takes_top_k(temperature, top_k, vocab)
        if kth_known:
            lower = tl.load(kth_ptr + row)
    cols = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_V], 2**31 - 1, tl.int32)
    bad = tl.zeros([BLOCK_V], tl.int32)
    m_lane = tl.full([BLOCK_V], float("-inf"), tl.float32)  # online softmax of x per lane
    z_lane = tl.zeros([BLOCK_V], tl.float32)
    race = tl.full([BLOCK_V], float("-inf"), tl.float32)
    race_idx = tl.full([BLOCK_V], 2**31 - 1, tl.int32)
    for start in range(chunk * BLOCK_V, vocab, num_chunks * BLOCK_V):
        idx = start + cols
        valid = idx < vocab
        raw = tl.load(base + idx, mask=valid, other=float("-inf")).to(tl.float32)
        best, best_idx, bad = fold_argmax(raw, idx, valid, best, best_idx, bad, MASKED)
        x = raw * inv_temp
        x = tl.where(x >= lower, x, float("-inf"))  # outside the top k: neither in the softmax nor the race
        m_new = tl.maximum(m_lane, x)
        z_lane = tl.where(m_new == float("-inf"), 0.0, z_lane * tl.exp(m_lane - m_new) + tl.exp(x - m_new))
        m_lane = m_new
        score = tl.where(valid & (x > float("-inf")), _race_score(x, idx, key), float("-inf"))
        better = score > race
        race = tl.where(better, score, race)
        race_idx = tl.where(better, idx, race_idx)
    part = row * num_chunks + chunk
    plane = num_rows * num_chunks
    chunk_max, chunk_idx = first_argmax(best, best_idx)
    m_chunk = tl.max(m_lane, axis=0)
    z_chunk = tl.sum(tl.where(m_lane == float("-inf"), 0.0, z_lane * tl.exp(m_lane - m_chunk)), axis=0)
    race_max, race_at = first_argmax(race, race_idx)
    # NOTE: indices and counts are stored as fp32, exact below 2**24 (vocabularies are far smaller)
    tl.store(work_ptr + part, chunk_max)
    tl.store(work_ptr + plane + part, chunk_idx.to(tl.float32))
    tl.store(work_ptr + 2 * plane + part, tl.sum(bad, axis=0).to(tl.float32))
    tl.store(work_ptr + 3 * plane + part, m_chunk)
    tl.store(work_ptr + 4 * plane + part, z_chunk)
    tl.store(work_ptr + 5 * plane + part, race_max)
    tl.store(work_ptr + 6 * plane + part, race_at.to(tl.float32))
    tl.debug_barrier()  # every thread's stores before the ticket (which releases them)
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if ticket == num_chunks - 1:
        c = tl.arange(0, BLOCK_C)
        parts = work_ptr + row * num_chunks + c
        c_mask = c < num_chunks
        maxes = tl.load(parts, mask=c_mask, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(parts + plane, mask=c_mask, other=0.0, cache_modifier=".cg").to(tl.int32)
        finite = tl.sum(tl.load(parts + 2 * plane, mask=c_mask, other=0.0, cache_modifier=".cg")) == 0
        if MASKED:
            finite = finite & (tl.max(maxes) > float("-inf"))
        ms = tl.load(parts + 3 * plane, mask=c_mask, other=float("-inf"), cache_modifier=".cg")
        zs = tl.load(parts + 4 * plane, mask=c_mask, other=0.0, cache_modifier=".cg")
        races = tl.load(parts + 5 * plane, mask=c_mask, other=float("-inf"), cache_modifier=".cg")
        race_idxs = tl.load(parts + 6 * plane, mask=c_mask, other=0.0, cache_modifier=".cg").to(tl.int32)
        x_max = tl.max(ms)
        z = tl.sum(tl.where(ms == float("-inf"), 0.0, zs * tl.exp(ms - x_max)))
        _, token = first_argmax(maxes, idxs)  # greedy
        state = tl.zeros([], tl.int32) + DONE
        x_won = tl.zeros([], tl.float32)
        if sampled:
            race_top, token = first_argmax(races, race_idxs)
            token = tl.where(race_top > float("-inf"), token, 0)  # no token raced (a row of -inf): flagged below
            x_won = tl.load(base + token).to(tl.float32) * inv_temp
            if (top_k > 0) & (top_p < 1.0) & (not kth_known):
                state = ALONE  # the nucleus needs the top-k set's mass
            elif (min_p > 0) & (x_won < x_max + tl.log(min_p)):
                state = ALONE  # the winner is below the min-p floor: race again above it
            elif ((top_k > 0) & (not kth_known)) | (top_p < 1.0):
                state = CHECK  # (z is the top-k set's when kth_known: the nucleus is relative to it)
        token = tl.where(finite, token, 0)
        state = tl.where(finite, state, DONE)
        rows = work_ptr + 7 * plane + row
        tl.store(rows, state.to(tl.float32))
        tl.store(rows + num_rows, x_max)
        tl.store(rows + 2 * num_rows, z)
        tl.store(rows + 3 * num_rows, x_won)
        tl.store(packed_ptr + row, token.to(tl.int64))
        tl.store(packed_ptr + num_rows + row, finite.to(tl.int64))
        tl.atomic_xchg(counter_ptr + row, 0)  # ready for the next call


@triton.jit(do_not_specialize=["num_rows", "num_chunks"])
def _check_kernel(
    logits_ptr,  # [S, V]
    params_ptr,  # [5, S] fp64
    work_ptr,  # fp32: [2, S, C] partials (over the race kernel's), then its [4, S] row state
    counter_ptr,  # [>= S] int32, zero between calls
    packed_ptr,  # [2, S] int64
    kth_ptr,  # [S] fp32 from step 0 (read when HAS_KTH)
    num_rows,
    num_chunks,
    vocab,
    stride_row,
    BLOCK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_KTH: tl.constexpr,
    PDL: tl.constexpr,
):
    """Whether each row's race winner w lies in the kept set: the count and the mass of the tokens above
    x_w, chunk c in program (s, c); the last program of a row accepts w or races again alone above it."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the race kernel's row state
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    plane = num_rows * num_chunks
    rows = work_ptr + 7 * plane + row
    state = tl.load(rows).to(tl.int32)
    temperature, top_k, top_p, min_p, key = _load_params(params_ptr, num_rows, row)
    inv_temp = 1.0 / tl.where(temperature > 0, temperature, 1.0)
    x_max = tl.load(rows + num_rows)
    base = logits_ptr + row.to(tl.int64) * stride_row
    alone = (state == ALONE) & (chunk == 0)
    above = tl.full([], float("-inf"), tl.float32)  # the slow path's exclusive bound
    if state == CHECK:
        z = tl.load(rows + 2 * num_rows)
        x_won = tl.load(rows + 3 * num_rows)
        cols = tl.arange(0, BLOCK_V)
        larger = tl.zeros([BLOCK_V], tl.int32)
        mass = tl.zeros([BLOCK_V], tl.float32)
        for start in range(chunk * BLOCK_V, vocab, num_chunks * BLOCK_V):
            idx = start + cols
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
            larger += (x > x_won).to(tl.int32)
            mass += tl.where(x > x_won, tl.exp(x - x_max), 0.0)
        part = row * num_chunks + chunk
        tl.store(work_ptr + part, tl.sum(larger, axis=0).to(tl.float32))
        tl.store(work_ptr + plane + part, tl.sum(mass, axis=0))
        tl.debug_barrier()
        ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if ticket == num_chunks - 1:
            c = tl.arange(0, BLOCK_C)
            c_mask = c < num_chunks
            parts = work_ptr + row * num_chunks + c
            count = tl.sum(tl.load(parts, mask=c_mask, other=0.0, cache_modifier=".cg"))
            count_mass = tl.sum(tl.load(parts + plane, mask=c_mask, other=0.0, cache_modifier=".cg"))
            # outside the kept set: so is every token at or below x_won; race again above it
            alone = ((top_k > 0) & (count >= top_k)) | ((top_p < 1.0) & (count_mass >= top_p * z))
            above = x_won
            tl.atomic_xchg(counter_ptr + row, 0)
    if alone:
        kth = tl.full([], float("-inf"), tl.float32)
        kth_known = False
        if HAS_KTH:
            kth_known = takes_top_k(temperature, top_k, vocab)
            if kth_known:
                kth = tl.load(kth_ptr + row)
        token = _sample_row(base, vocab, inv_temp, top_k, top_p, min_p, key, x_max, above, kth, kth_known, BLOCK_V)
        tl.store(packed_ptr + row, token.to(tl.int64))


def pack_params(
    temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float], keys: list[int],
    pin: bool = False,
) -> torch.Tensor:  # fmt: skip
    """The [5, S] fp64 host tensor the kernel reads (every value exact in fp64: keys are < 2**32), in
    pinned memory when `pin` (a non-blocking copy to the GPU then needs no staging copy)."""
    return torch.tensor([temperature, top_k, top_p, min_p, keys], dtype=torch.float64, pin_memory=pin)


def asks_step_0(temperature: float, top_k: int, top_p: float) -> bool:
    """Whether a row's params make step 0 pay: it samples with top-k and top-p (which without step 0
    always takes the single-program path). Top-k alone keeps the check: step 0's four Triton launches cost
    more host time a call than a peaked distribution's rare refusal (decision 0004)."""
    return temperature > 0 and top_k > 0 and top_p < 1.0


def wants_step_0(rows_ask: bool, num_rows: int, vocab: int, device: torch.device) -> bool:
    """select_top_k for a batch where some row asks_step_0 (`rows_ask`): only with more than one program
    a row (with one, step 0 reads the row four times as the single-program path would). Plain Python:
    the engine calls it every sampled step."""
    return rows_ask and row_chunks(num_rows, vocab, device, None) > 1


def random_sample(
    logits: torch.Tensor, params: torch.Tensor, *, masked: bool = False, chunks: int | None = None,
    select_top_k: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """[S, V] logits and [5, S] params (pack_params, on logits' device) -> [2, S] int64 (token, finite).

    masked: -inf marks a token a grammar forbids (the module's docstring). chunks overrides the programs per
    row (tests). select_top_k: whether to run step 0 first (None: wants_step_0's rule, asking the params
    here, which waits for the device if they live there; False leaves top-k to the check and the
    single-program path)."""
    check_device(_race_kernel, "logits and params", logits, params)
    check_logits(logits)
    num_rows, vocab = logits.shape
    if params.shape != (len(PARAM_ROWS), num_rows) or params.dtype != torch.float64 or not params.is_contiguous():
        raise ValueError(f"params must be a contiguous [{len(PARAM_ROWS)}, {num_rows}] float64 tensor "
                         f"{PARAM_ROWS}, got {tuple(params.shape)} {params.dtype}")  # fmt: skip
    packed = torch.empty((2, num_rows), dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return packed
    chunks = row_chunks(num_rows, vocab, logits.device, chunks)
    if select_top_k is None:
        host = params.tolist()  # waits for the device if the params live there
        rows_ask = any(asks_step_0(t, k, p) for t, k, p in zip(host[0], host[1], host[2], strict=True))
        select_top_k = rows_ask and chunks > 1
    work = torch.empty(7 * num_rows * chunks + 4 * num_rows, dtype=torch.float32, device=logits.device)
    counters = ticket_counters(num_rows, logits.device)
    kth = top_k_thresholds_on(logits, params, chunks, counters) if select_top_k else work
    args = (logits, params, work, counters, packed, kth, num_rows, chunks, vocab, logits.stride(0))
    tiles = dict(BLOCK_C=MAX_CHUNKS, BLOCK_V=BLOCK_V, HAS_KTH=select_top_k, num_warps=NUM_WARPS)
    _race_kernel[(num_rows, chunks)](*args, **tiles, MASKED=masked, **pdl_options(logits.device))
    _check_kernel[(num_rows, chunks)](*args, **tiles, **pdl_options(logits.device))
    return packed
