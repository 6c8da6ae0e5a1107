"""The engine's sampling in torch, on any device: the (key, token) hash, the top-k / top-p / min-p filters by
sorting, and the exponential race. engine/sampler.py samples rows with penalties, bias or min_tokens here, and
`random_sample_torch` is ops.random_sample's torch path. kernels/random_sample.py draws the same tokens without
sorting; tests/kernels/test_random_sample.py holds the kernel to these functions.

Legend: S = rows, V = vocabulary.
"""

from __future__ import annotations

import math

import torch

from kernels.greedy_sample import masked_rows_finite

_M32 = 0xFFFFFFFF


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
    # NOTE: (2**24 - 0.5) / 2**24 rounds to 1.0 in fp32, whose noise -log(1) = 0 would make that token
    # lose every race (p / -0.0 = -inf) or win it (log-space: x - log 0 = +inf) by the arithmetic
    # chosen; clamped to the largest float below 1 it is a draw like any other (1 token in 2**24)
    return (((x >> 8).to(torch.float32) + 0.5) / float(1 << 24)).clamp_(max=1.0 - 2.0**-24)


def host_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Per-row values from the host without waiting for the device.

    NOTE: torch.tensor(values, device="cuda") copies from pageable memory and then synchronizes
    the stream, i.e. waits for the whole forward pass (decision 0005). A copy from pinned memory is
    queued instead (the caching host allocator keeps the block until it is done).
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


def random_sample_torch(logits: torch.Tensor, params: torch.Tensor, masked: bool = False) -> torch.Tensor:
    """kernels/random_sample.py's random_sample by sorting (NOTE: reads params on the host: a sync on CUDA);
    masked as the kernel's (-inf: a token a grammar forbids)."""
    temperature, top_k, top_p, min_p, keys = params.tolist()
    finite = masked_rows_finite(logits) if masked else torch.isfinite(logits).all(dim=-1)  # [S]
    logits = torch.where(finite[:, None], logits.float(), 0.0)
    tokens = logits.argmax(dim=-1)
    sampled = [row for row, t in enumerate(temperature) if t > 0]
    if sampled:
        pick = lambda values: [values[row] for row in sampled]  # noqa: E731
        tokens[sampled] = race_sample(logits[sampled], pick(temperature), [int(k) for k in pick(top_k)], pick(top_p),
                                      pick(min_p), [int(k) for k in pick(keys)])  # fmt: skip
    return torch.stack((tokens, finite.to(torch.int64)))
