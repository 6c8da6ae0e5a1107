"""Seeded random sampling with temperature, top-k, top-p and min-p, one program per row, no sort.

Legend: S = rows (sequences that sample this step), V = vocabulary.
    logits [S, V], params [5, S] fp64 (temperature, top_k, top_p, min_p, key) -> [2, S] int64:
    row 0 the token ids, row 1 1 where every logit of the row is finite, else 0 (greedy_sample's
    packing, so the engine reads both with its step's one copy).

Math (engine/sampler.py's reference, which sorts): x = logits / temperature; the kept set K is
    top-k:  the k largest x (k = 0: every token),
    top-p:  tokens whose strictly larger tokens hold less than top_p of the probability mass
            (softmax over the top-k set), the largest always kept,
    min-p:  tokens with p >= min_p * p_max, i.e. x >= max(x) + log(min_p);
and the token is the exponential race argmax_{v in K} p_v / E_v, E_v = -log(u_v) with u_v the
counter hash of (key, v). As argmax_v (x_v - log E_v) it needs neither the softmax nor the sort:
    1. one pass: the row's max and first argmax, and whether every logit is finite;
    2. top-k: the k-th largest x by radix select (4 passes of 8-bit digit histograms), a lower bound;
    3. top-p: z = sum of exp(x - max) over the top-k set (one pass);
    4. the race over x above the bounds (one pass) gives w; with top-p, one more pass sums the
       mass of the tokens above x_w. If it reaches top_p * z, w is outside the nucleus and so is
       every token below it: the bound rises to x_w and the race runs again. The race's winner
       over a superset of K that lies in K is K's winner, so the result is the reference's.
       A race's winner falls outside the nucleus with probability about 1 - top_p: ~1 extra round
       in 20 at top_p = 0.95.
Temperature 0 is greedy (the first argmax, as torch.argmax). A row with a non-finite logit gets
token 0 and finite 0: the engine reports it as an error and never uses the token.

Precision contract: the same token as the reference except where two candidates' scores are
within float rounding of each other (the race compares x - log E instead of p / E, and exp and
log differ by an ulp between libraries), or where the reference breaks ties by sort order: it
keeps exactly k of several tokens tied at the k-th value, and cuts the nucleus inside a run of
equal probabilities; here ties at the k-th value all stay, and equal tokens are in or out together.

Why: the reference is ~40-60 small torch operations a sampled step (a sort of the whole vocabulary
among them), each a launch from Python; at batch 1 the 1B model's sampled step was host-bound,
2.8 ms against 1.2 ms greedy (H100, bench/results/h100/engine_decode_latency.md).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

BLOCK_V = 4096
NUM_WARPS = 8
PARAM_ROWS = ("temperature", "top_k", "top_p", "min_p", "key")
_M32 = 0xFFFFFFFF


@triton.jit
def _mix32(x):
    """engine/sampler.py's _mix32 on uint32 (its int64 products masked to 32 bits are these wrapping ones)."""
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def _race_score(x, idx, key):
    """x - log(E) with E = -log(u), u the (key, token id) uniform: the log of p / E up to a row constant."""
    h = _mix32(key + idx.to(tl.uint32) * 0x9E3779B)  # token id x the hash's odd step (uniform_from_keys)
    u = ((h >> 8).to(tl.float32) + 0.5) / 16777216.0
    return x - tl.log(-tl.log(u))


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
def _kth_largest(base, vocab, k, inv_temp, BLOCK_V: tl.constexpr):
    """The k-th largest of x = logits * inv_temp over the row (k >= 1), by radix select on _ordered(x)."""
    cols = tl.arange(0, BLOCK_V)
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], tl.uint32)
    remaining = k
    for digit in tl.static_range(4):
        shift = 24 - 8 * digit
        counts = tl.zeros([256], tl.int32)
        for start in range(0, vocab, BLOCK_V):
            idx = start + cols
            x = tl.load(base + idx, mask=idx < vocab, other=0.0).to(tl.float32) * inv_temp
            key = _ordered(x)
            if digit == 0:
                match = idx < vocab
            else:
                match = (idx < vocab) & ((key >> (shift + 8)) == prefix)
            counts += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
        # bins from the top: at_or_above[b] = tokens of this prefix whose digit is >= b
        at_or_above = tl.sum(counts) - tl.cumsum(counts, axis=0) + counts
        b = tl.max(tl.where(at_or_above >= remaining, bins, 0))
        remaining -= tl.sum(tl.where(bins > b, counts, 0))
        prefix = (prefix << 8) | b.to(tl.uint32)
    return _from_ordered(prefix)


@triton.jit(do_not_specialize=["num_rows"])
def _sample_kernel(
    logits_ptr,  # [S, V]
    params_ptr,  # [5, S] fp64: temperature (0: greedy), top_k (0: off), top_p (1: off), min_p (0: off), key
    packed_ptr,  # [2, S] int64
    num_rows,
    vocab,
    stride_row,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the logits come from the kernel before; nothing here is a weight
    row = tl.program_id(0)
    temperature = tl.load(params_ptr + row).to(tl.float32)
    top_k = tl.load(params_ptr + num_rows + row).to(tl.int32)
    top_p = tl.load(params_ptr + 2 * num_rows + row).to(tl.float32)
    min_p = tl.load(params_ptr + 3 * num_rows + row).to(tl.float32)
    key = tl.load(params_ptr + 4 * num_rows + row).to(tl.int64).to(tl.uint32)
    base = logits_ptr + row.to(tl.int64) * stride_row
    cols = tl.arange(0, BLOCK_V)

    # 1. max, first argmax, non-finite count
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_V], 2**31 - 1, tl.int32)
    bad = tl.zeros([BLOCK_V], tl.int32)
    for start in range(0, vocab, BLOCK_V):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        bad += (((x != x) | (tl.abs(x) == float("inf"))) & (idx < vocab)).to(tl.int32)
        better = x > best  # strict: an earlier column keeps a tie
        best = tl.where(better, x, best)
        best_idx = tl.where(better, idx, best_idx)
    row_max = tl.max(best)
    token = tl.min(tl.where(best == row_max, best_idx, 2**31 - 1))
    finite = tl.sum(bad) == 0
    token = tl.where(finite, token, 0)

    if finite & (temperature > 0):
        inv_temp = 1.0 / temperature
        x_max = row_max * inv_temp
        # the lower bounds: top-k (the k-th largest, inclusive) and min-p (inclusive)
        lower = tl.full([], float("-inf"), tl.float32)
        if top_k > 0 and top_k < vocab:
            lower = _kth_largest(base, vocab, top_k, inv_temp, BLOCK_V)
        if min_p > 0:
            lower = tl.maximum(lower, x_max + tl.log(min_p))
        nucleus = top_p < 1.0
        mass = tl.zeros([], tl.float32)
        if nucleus:  # 3. the softmax's denominator over the top-k set
            z = tl.zeros([BLOCK_V], tl.float32)
            for start in range(0, vocab, BLOCK_V):
                idx = start + cols
                x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temp
                z += tl.where(x >= lower, tl.exp(x - x_max), 0.0)
            mass = top_p * tl.sum(z)
        # 4. races, each above the last winner that fell outside the nucleus
        above = tl.full([], float("-inf"), tl.float32)  # exclusive bound
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
            won = tl.max(race)
            token = tl.min(tl.where(race == won, race_idx, 2**31 - 1))
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
    tl.store(packed_ptr + row, token.to(tl.int64))
    tl.store(packed_ptr + num_rows + row, finite.to(tl.int64))


def pack_params(
    temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float], keys: list[int]
) -> torch.Tensor:
    """The [5, S] fp64 host tensor the kernel reads (every value exact in fp64: keys are < 2**32)."""
    return torch.tensor([temperature, top_k, top_p, min_p, keys], dtype=torch.float64)


def random_sample(logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """[S, V] logits and [5, S] params (pack_params, on logits' device) -> [2, S] int64 (token, finite)."""
    check_device(_sample_kernel, "logits and params", logits, params)
    check_float("logits", logits)
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be [S, V] with V > 0, got shape {tuple(logits.shape)}")
    if logits.stride(1) != 1:
        raise ValueError(f"logits must be contiguous in its last dim, got strides {logits.stride()}")
    num_rows, vocab = logits.shape
    if params.shape != (len(PARAM_ROWS), num_rows) or params.dtype != torch.float64 or not params.is_contiguous():
        raise ValueError(f"params must be a contiguous [{len(PARAM_ROWS)}, {num_rows}] float64 tensor "
                         f"{PARAM_ROWS}, got {tuple(params.shape)} {params.dtype}")  # fmt: skip
    out = torch.empty((2, num_rows), dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    _sample_kernel[(num_rows,)](
        logits, params, out, num_rows, vocab, logits.stride(0),
        BLOCK_V=BLOCK_V, num_warps=NUM_WARPS, **pdl_options(logits.device),
    )  # fmt: skip
    return out


# ---- the reference: plain torch, the engine's sampler on any device ----------------------------
def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values in [0, 2**32).

    NOTE: the multipliers are below 2**31, so every product stays below 2**63 and
    int64 never overflows: the hash is the same on every device.
    """
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


_VOCAB_STEPS: dict[tuple[int, torch.device], torch.Tensor] = {}


def uniform_from_keys(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[S] int64 keys (engine.sampler.sampling_key) -> [S, V] uniform floats in (0, 1)."""
    cache_key = (vocab_size, keys.device)
    steps = _VOCAB_STEPS.get(cache_key)
    if steps is None:  # token id * the hash's odd step, once per vocabulary and device
        steps = torch.arange(vocab_size, device=keys.device, dtype=torch.int64) * 0x9E3779B
        _VOCAB_STEPS[cache_key] = steps
    x = mix32((keys[:, None] + steps[None, :]) & _M32)  # [S, V]
    return ((x >> 8).to(torch.float32) + 0.5) / float(1 << 24)


def host_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Per-row values from the host without waiting for the device.

    NOTE: torch.tensor(values, device="cuda") copies from pageable memory and then synchronizes
    the stream, i.e. waits for the whole forward pass: on an H100 that made every sampled batch-1
    step cost ~3 ms of waiting and launching for the 1B model's 1.3 ms of GPU work. A copy from
    pinned memory is queued instead (the caching host allocator keeps the block until it is done).
    """
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def filter_top_k_top_p_min_p(
    logits: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]
) -> torch.Tensor:
    """Masks (to -inf) tokens outside each row's top-k, nucleus and min-p sets.

    NOTE: a filter no row asks for is left out (each is 3-5 device ops, and the sampled step is
    host-bound). A row's tokens never depend on the other rows: top_p 1.0 keeps every token whether
    or not another row's top_p < 1 computes the nucleus, where it is compared with +inf rather than
    with a cumulative sum that rounding could bring to 1.0 before the last tokens."""
    device = logits.device
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [S, V]
    if any(kk > 0 for kk in top_k):
        rank = torch.arange(vocab, device=device)[None, :]
        k = host_to_device([kk if kk > 0 else vocab for kk in top_k], torch.int64, device)[:, None]
        sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    nucleus, floor = any(p < 1.0 for p in top_p), any(min_p)
    if nucleus or floor:
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = torch.zeros_like(probs, dtype=torch.bool)
        if nucleus:
            # top_p 1.0 keeps every token, in a batch as alone (never compared with a rounded 1.0)
            p = host_to_device([pp if pp < 1.0 else math.inf for pp in top_p], probs.dtype, device)[:, None]
            # Drop a token when the mass before it already reaches top_p (the first token always stays).
            drop |= probs.cumsum(dim=-1) - probs >= p
        if floor:
            mp = host_to_device(min_p, probs.dtype, device)[:, None]
            drop |= probs < mp * probs[:, :1]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def race_sample(
    logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float],
    keys: list[int],
) -> torch.Tensor:  # fmt: skip
    """[S, V] finite logits -> [S] tokens: temperature (> 0), the filters, then the exponential race
    argmax p / E over each row's (key, token) noise."""
    device = logits.device
    logits = logits / host_to_device(temperature, torch.float32, device)[:, None]
    if any(top_k) or any(p < 1.0 for p in top_p) or any(min_p):
        logits = filter_top_k_top_p_min_p(logits, top_k, top_p, min_p)
    probs = torch.softmax(logits, dim=-1)
    noise = -torch.log(uniform_from_keys(host_to_device(keys, torch.int64, device), logits.shape[-1]))  # [S, V]
    return (probs / noise).argmax(dim=-1)


def random_sample_ref(logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """random_sample by sorting (NOTE: reads params on the host: a sync on CUDA)."""
    temperature, top_k, top_p, min_p, keys = params.tolist()
    finite = torch.isfinite(logits).all(dim=-1)  # [S]
    logits = torch.where(finite[:, None], logits.float(), 0.0)
    tokens = logits.argmax(dim=-1)
    sampled = [row for row, t in enumerate(temperature) if t > 0]
    if sampled:
        pick = lambda values: [values[row] for row in sampled]  # noqa: E731
        tokens[sampled] = race_sample(logits[sampled], pick(temperature), [int(k) for k in pick(top_k)], pick(top_p),
                                      pick(min_p), [int(k) for k in pick(keys)])  # fmt: skip
    return torch.stack((tokens, finite.to(torch.int64)))
