"""A caller's request as the engine's Requests: one per choice (n), each with its seed, its prior output
(a resumed request) and the token limit the scheduler keeps it under."""

from __future__ import annotations

import random

from engine.request import Request
from engine.request_checks import split_priors
from engine.sampling_params import MAX_SEED, SamplingParams

_GOLDEN = 0x9E3779B97F4A7C15


def child_seed(seed: int, index: int) -> int:
    """Choice i of an n > 1 request gets its own stream, still a function of the seed."""
    return seed if index == 0 else (seed + index * _GOLDEN) % (MAX_SEED + 1)


def choices_of(
    request_id: str, prompt_token_ids: list[int], params: SamplingParams,
    prior_output_token_ids: list[int] | list[list[int]] | None, priority: int, eos_token_ids: frozenset[int],
    max_model_len: int,
) -> list[Request]:  # fmt: skip
    """The Requests of one caller's request: `request_id` itself for n == 1, `request_id#i` for choice i of n > 1;
    a resumed choice's prior output follows its prompt. An unseeded request draws its seed here, once, so that
    every choice derives its own from it."""
    priors = split_priors(prior_output_token_ids, params.n)
    seed = params.seed if params.seed is not None else random.getrandbits(63)
    requests = []
    for index in range(params.n):
        prior = priors[index]
        requests.append(Request(
            request_id=request_id if params.n == 1 else f"{request_id}#{index}",
            prompt_token_ids=list(prompt_token_ids) + prior,
            sampling_params=params,
            eos_token_ids=eos_token_ids,
            priority=priority,
            seed=child_seed(seed, index),
            num_prior_output_tokens=len(prior),
            parent_id=request_id if params.n > 1 else None,
            choice_index=index,
            max_num_tokens=_max_num_tokens(len(prompt_token_ids) + len(prior), len(prior), params, max_model_len),
        ))  # fmt: skip
    return requests


def _max_num_tokens(num_tokens: int, num_prior: int, params: SamplingParams, max_model_len: int) -> int:
    """Tokens the request may hold in all: the limit the scheduler keeps pending tokens under."""
    if params.max_tokens is None:
        return max_model_len
    return min(max_model_len, num_tokens + params.max_tokens - num_prior)


def reads_history(params: SamplingParams) -> bool:
    """Sampling that reads the request's earlier tokens on the host: it needs the previous
    step's tokens before it runs, so steps with such a request are not overlapped. (A grammar's mask also
    needs the previous token, but only on the host once the next forward is queued: ModelRunner reads it
    then, so constrained requests keep the overlap.)"""
    return params.repetition_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)
