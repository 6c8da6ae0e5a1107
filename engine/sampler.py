"""Batched sampling: penalties, logit bias, temperature, top-k / top-p / min-p,
greedy or seeded random choice, logprobs.

Legend: S = sequences that sample this step, V = vocabulary.

Randomness is counter-based: the uniform draw for token v of a request is a hash
of (seed, position, v). The chosen token is argmax(p / E) with E = -log(u)
exponential noise (the "exponential race", equivalent to sampling from p). So
the token at a position depends only on the logits, the seed and the position:
a request re-run from any point, on any device, batch or worker, makes the same
choices. Every request has a seed: a random one when the caller gives none.

On CUDA, rows that only choose (no penalties, bias or min_tokens) take the sort-free kernels of
kernels/random_sample.py (through engine/ops.py); other rows, and every row off CUDA, the torch sampling of
engine/torch_sampling.py, which draws the same tokens. A grammar's mask keeps a row on the kernels: it goes
over the logits in place first, and the kernels then take -inf as a forbidden token (their `masked`). A NaN
or infinity at a token the mask forbids is then overwritten unseen (it could never be chosen); one the mask
leaves standing still fails its row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from engine import ops
from engine.request import Logprob, Request
from engine.sampling_params import SamplingParams
from engine.structured_output.masking import MaskBuffers, apply_grammar_masks
from engine.torch_sampling import host_to_device, mix32, race_sample, uniform_from_keys
from kernels.random_sample import asks_step_0, pack_params

_M32 = 0xFFFFFFFF


def _mix32_int(x: int) -> int:
    """_mix32 on one Python int in [0, 2**32): the same bits (every product stays below 2**63)."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & _M32
    x ^= x >> 15
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


@functools.lru_cache(maxsize=1 << 16)
def _seed_key(seed: int) -> int:
    """The position-free part of sampling_key: a request's seed never changes, so each step pays
    one mix a row instead of three (decision 0023)."""
    return _mix32_int((seed & _M32) ^ _mix32_int((seed >> 32) & _M32))


def sampling_key(seed: int, position: int) -> int:
    """The key of (seed, position) that seeded_uniform hashes with each token id, on the host.

    NOTE: the sampler computes it here, not on the device: as tensor ops it was ~30 kernel launches of
    [S]-sized tensors a sampled step (seeds and positions are host values anyway)."""
    return _mix32_int(_seed_key(seed) ^ (position & _M32))


def sampling_keys(requests: list[Request]) -> list[int]:
    """Each request's key for the token it samples next (at num_tokens_with_pending)."""
    return [_mix32_int(_seed_key(r.seed) ^ (r.num_tokens_with_pending & _M32)) for r in requests]


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[S] seeds and [S] positions -> [S, V] uniform floats in (0, 1), a pure function of its inputs."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    key = mix32(mix32(lo ^ mix32(hi)) ^ (positions & _M32))  # [S]
    return uniform_from_keys(key, vocab_size)


@dataclass
class SamplerOutput:
    """token_ids: one per row; logprobs: per row when that request asked for them;
    errors: per row, a message when the row's logits were not finite."""

    token_ids: list[int]
    logprobs: list[Logprob | None]
    errors: list[str | None]


class Sampler:
    """Turns the last-position logits of the sampling rows into tokens."""

    def __init__(self) -> None:
        self._mask_buffers = MaskBuffers()

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        """
        Args:
            logits: [S, V] float, one row per request that samples this step (in order); `sample`
                widens 16-bit ones.
            requests: the S requests; each samples the token at position
                `request.num_tokens_with_pending` (async scheduling: the previous step's token
                may be sampled but not yet read).

        NOTE: reads the tokens (and logprobs) on the host, so it waits for the device; the
        runner calls `sample_packed` instead when no row asks for logprobs.
        """
        num_rows = logits.shape[0]
        token_ids, bad, raw_logprobs = self.sample(logits, requests)
        token_list = token_ids.tolist()
        bad_list = bad.tolist()
        logprob_list: list[Logprob | None] = [None] * num_rows
        if raw_logprobs is not None:
            for row, request in enumerate(requests):
                k = request.sampling_params.logprobs
                if k is None:
                    continue
                chosen = float(raw_logprobs[row, token_list[row]])
                top: dict[int, float] = {}
                if k > 0:
                    values, indices = raw_logprobs[row].topk(k)
                    top = dict(zip(indices.tolist(), values.tolist(), strict=True))
                logprob_list[row] = Logprob(token_list[row], chosen, top)
        errors = [
            f"non-finite logits at position {r.num_tokens_with_pending}" if is_bad else None
            for r, is_bad in zip(requests, bad_list, strict=True)
        ]
        return SamplerOutput(token_list, logprob_list, errors)

    def sample_packed(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """[2, S] int64 on the device (token ids, 1 where the row's logits were all finite), without
        waiting for it. When every row only chooses (greedy, temperature, top-k/p, min-p: no
        penalties, bias or min_tokens), a grammar's mask aside, that is ops.random_sample (two kernels on CUDA)
        or ops.greedy_sample, after the masks go over the logits in place; else `sample`."""
        if all(map(chooses_after_mask, requests)):
            masked = any(r.grammar is not None for r in requests)
            if masked:
                apply_grammar_masks(logits, requests, self._mask_buffers)
                if all(r.sampling_params.is_greedy for r in requests):
                    return ops.greedy_sample(logits, masked=True)
            vocab = logits.shape[-1]
            rows = [
                (0.0 if p.is_greedy else p.temperature, top_k_within(p, vocab), p.top_p, p.min_p)
                for p in (r.sampling_params for r in requests)
            ]
            columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[], [], [], []]
            params = pack_params(*columns, sampling_keys(requests), pin=logits.is_cuda)
            rows_ask = any(asks_step_0(t, k, p) for t, k, p, _ in rows)
            return ops.random_sample(logits, params, rows_ask_step_0=rows_ask, masked=masked)
        token_ids, bad, _ = self.sample(logits, requests)
        return torch.stack([token_ids, (~bad).to(torch.int64)])

    def warm_up(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """Runs `sample_packed`'s kernel path once for each variant it builds (without and with top-k's step 0,
        kernels/random_sample.py) on logits [R, V] shaped as a step's, so that an engine builds them while it
        starts and not inside its first sampled steps. Returns their [2, R] outputs (for the caller's own
        hand-back kernel to warm up on). Rows vary freely: the kernels take them as run-time values."""
        num_rows = logits.shape[0]
        outputs = []
        for top_k, rows_ask in ((0, False), (min(20, logits.shape[1]), True)):  # the check alone; step 0
            params = pack_params([0.8] * num_rows, [top_k] * num_rows, [0.9] * num_rows, [0.0] * num_rows,
                                 list(range(num_rows)), pin=logits.is_cuda)  # fmt: skip
            outputs.append(ops.random_sample(logits, params, rows_ask_step_0=rows_ask))
        return outputs

    def sample(
        self, logits: torch.Tensor, requests: list[Request]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(token ids [S] int64, non-finite rows [S] bool, log-softmax [S, V] or None when no row
        asks for logprobs), all on the device. Only presence/frequency penalties wait for it
        (torch.unique); otherwise the per-request values come from the host, so the runner can
        read the tokens a step later (requests with penalties run synchronous steps anyway).

        logits may be in the model's dtype (the LM head's output, LMHead widen=False): they are widened
        here, since the penalties, bias and log-softmax compute on them in place."""
        logits = logits.float()  # exact: the values of the LM head's float32 output
        bad = ~torch.isfinite(logits).all(dim=-1)  # [S]
        logits = torch.where(bad[:, None], torch.zeros_like(logits), logits)
        wants_logprobs = any(r.sampling_params.logprobs is not None for r in requests)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if wants_logprobs else None

        # NOTE: no clone: torch.where made `logits` a tensor of this call's own, which the in-place
        # penalties may change (raw_logprobs is already computed)
        logits = self._apply_penalties(logits, requests)
        logits = self._apply_bias_and_min_tokens(logits, requests)
        logits = apply_grammar_masks(logits, requests, self._mask_buffers)  # only the constrained rows

        greedy_rows = [r.sampling_params.is_greedy for r in requests]
        if all(greedy_rows):
            return logits.argmax(dim=-1), bad, raw_logprobs
        sampled = self._sample_random(logits, requests)
        if any(greedy_rows):
            greedy = host_to_device(greedy_rows, torch.bool, logits.device)
            sampled = torch.where(greedy, logits.argmax(dim=-1), sampled)
        return sampled, bad, raw_logprobs

    # ---- logit processing -----------------------------------------------
    def _apply_penalties(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        for row, request in enumerate(requests):
            p = request.sampling_params
            if p.repetition_penalty != 1.0:
                # HF semantics: over prompt and output tokens, shrink positive logits, grow negative ones.
                seen = torch.tensor(sorted(set(request.all_token_ids)), device=logits.device)
                values = logits[row, seen]
                logits[row, seen] = torch.where(
                    values > 0, values / p.repetition_penalty, values * p.repetition_penalty
                )
            if p.presence_penalty or p.frequency_penalty:
                # OpenAI semantics: over generated tokens only (resumed ones included).
                output = request.all_token_ids[request.num_prompt_tokens - request.num_prior_output_tokens :]
                if output:
                    ids, counts = torch.tensor(output, device=logits.device).unique(return_counts=True)
                    logits[row, ids] -= p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty
        return logits

    def _apply_bias_and_min_tokens(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        vocab = logits.shape[-1]
        for row, request in enumerate(requests):
            p = request.sampling_params
            if p.logit_bias:
                for token, bias in p.logit_bias.items():
                    if 0 <= int(token) < vocab:
                        logits[row, int(token)] += bias
            if request.num_output_tokens + request.num_pending_tokens < p.min_tokens:
                stop_ids = [t for t in (*request.eos_token_ids, *p.stop_token_ids) if 0 <= t < vocab]
                if stop_ids:
                    logits[row].index_fill_(0, host_to_device(stop_ids, torch.int64, logits.device), float("-inf"))
        return logits

    def _sample_random(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        vocab = logits.shape[-1]
        return race_sample(
            logits,
            [1.0 if r.sampling_params.is_greedy else r.sampling_params.temperature for r in requests],
            [top_k_within(r.sampling_params, vocab) for r in requests],
            [r.sampling_params.top_p for r in requests],
            [r.sampling_params.min_p for r in requests],
            sampling_keys(requests),
        )


def top_k_within(params: SamplingParams, vocab_size: int) -> int:
    """top_k as sampling applies it: 0 (off) when disabled or when k keeps the whole vocabulary (vLLM clamps
    it so too); any k the limits allow (up to 2**31 - 1) then fits every integer type a kernel takes."""
    k = params.effective_top_k
    return k if k < vocab_size else 0


def only_chooses(request: Request) -> bool:
    """Nothing changes the row's logits before the choice (penalties, bias, min_tokens, a grammar's mask)."""
    return request.grammar is None and chooses_after_mask(request)


def chooses_after_mask(request: Request) -> bool:
    """Nothing but a grammar's mask changes the row's logits before the choice (no penalties, bias or
    min_tokens)."""
    p = request.sampling_params
    return (
        p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and not p.logit_bias
        and request.num_output_tokens + request.num_pending_tokens >= p.min_tokens
    )
