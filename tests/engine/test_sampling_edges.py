"""Every float sampling field at the smallest and largest value it accepts samples sensibly: the tokens
follow the distribution the field defines (computed here in float64 from its definition), and so contain no
trace of a NaN or an infinity (a NaN row's argmax is one fixed token); the values just past each limit are
refused (tests/engine/test_sampling_params.py). Temperatures below 1e-5, subnormals included, are greedy.

Then the same edges through a real engine: greedy-equivalent ones give the greedy tokens, the others finish
normally with tokens in the vocabulary.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from engine.request import Request
from engine.sampler import Sampler
from engine.sampling_params import GREEDY_TEMPERATURE, SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts

BASE = torch.tensor([2.0, 1.5, 1.2, 0.8, 0.0, -0.5, -1.0, -3.0])  # one row's logits, V = 8
V = BASE.numel()
PROMPT, OUTPUT = (1, 5, 7), (2, 2, 6)  # what the penalties see: 2 was generated twice, 6 once
NUM_DRAWS = 4000

SUBNORMAL = 5e-324
# (params, what to expect): every float field at its smallest and largest accepted value
EDGES = [
    ({"temperature": 0.0}, "greedy"),
    ({"temperature": SUBNORMAL}, "greedy"),
    ({"temperature": 1e-300}, "greedy"),
    ({"temperature": math.nextafter(GREEDY_TEMPERATURE, 0.0)}, "greedy"),
    ({"temperature": GREEDY_TEMPERATURE}, "sampled"),  # the smallest temperature that samples
    ({"temperature": 2.0}, "sampled"),
    ({"top_p": SUBNORMAL}, "sampled"),
    ({"top_p": 1.0}, "sampled"),
    ({"min_p": 0.0}, "sampled"),
    ({"min_p": 1.0}, "sampled"),
    ({"presence_penalty": -2.0}, "sampled"),
    ({"presence_penalty": 2.0}, "sampled"),
    ({"frequency_penalty": -2.0}, "sampled"),
    ({"frequency_penalty": 2.0}, "sampled"),
    ({"repetition_penalty": 0.01}, "sampled"),
    ({"repetition_penalty": 10.0}, "sampled"),
    ({"logit_bias": {3: 100.0}}, "sampled"),
    ({"logit_bias": {0: -100.0}}, "sampled"),
    ({"top_k": 2**31 - 1}, "sampled"),  # the largest k: the whole vocabulary
    ({"top_k": 1}, "sampled"),
    # every extreme at once: the largest logit shifts under the smallest temperature that samples
    (
        {
            "temperature": GREEDY_TEMPERATURE,
            "repetition_penalty": 0.01,
            "frequency_penalty": -2.0,
            "presence_penalty": -2.0,
            "logit_bias": {7: 100.0},
        },
        "sampled",
    ),  # fmt: skip
]


def expected_distribution(params: dict) -> torch.Tensor:
    """[V] float64: the distribution `params` define over BASE (HF repetition penalty over prompt and output,
    OpenAI presence/frequency penalties over the output, bias, temperature, then top-k, top-p and min-p)."""
    p = SamplingParams(**params)
    x = BASE.double().clone()
    for token in set(PROMPT) | set(OUTPUT):
        x[token] = x[token] / p.repetition_penalty if x[token] > 0 else x[token] * p.repetition_penalty
    for token, count in Counter(OUTPUT).items():
        x[token] -= p.frequency_penalty * count + p.presence_penalty
    for token, bias in (p.logit_bias or {}).items():
        x[token] += bias
    if p.temperature < GREEDY_TEMPERATURE:
        return torch.nn.functional.one_hot(x.argmax(), V).double()
    probs = torch.softmax(x / p.temperature, dim=0)
    order = probs.argsort(descending=True)
    keep = torch.zeros(V, dtype=torch.bool)
    mass = 0.0
    for rank, token in enumerate(order.tolist()):
        in_k = p.top_k <= 0 or rank < p.top_k
        in_p = rank == 0 or mass < p.top_p
        in_min_p = probs[token] >= p.min_p * probs[order[0]]
        keep[token] = in_k and in_p and in_min_p
        mass += probs[token].item()
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


def draws(params: dict) -> tuple[list[int], list[int]]:
    """NUM_DRAWS tokens (one per seed) by the host path and by the packed path the runner takes."""
    sampling = SamplingParams(**params)
    requests = []
    for seed in range(NUM_DRAWS):
        request = Request("r", list(PROMPT), sampling, eos_token_ids=frozenset({7}), seed=seed)
        for token in OUTPUT:
            request.append_token(token)
        requests.append(request)
    logits = BASE[None].repeat(NUM_DRAWS, 1)
    sampler = Sampler()
    host = sampler(logits, requests)
    assert host.errors == [None] * NUM_DRAWS
    packed = sampler.sample_packed(logits, requests)
    assert packed[1].tolist() == [1] * NUM_DRAWS  # every row finite
    return host.token_ids, packed[0].tolist()


@pytest.mark.parametrize(("params", "kind"), EDGES, ids=[str(p) for p, _ in EDGES])
def test_edge_values_sample_from_the_distribution_they_define(params: dict, kind: str) -> None:
    assert SamplingParams(**params).is_greedy == (kind == "greedy")
    host, packed = draws(params)
    assert host == packed
    assert all(0 <= t < V for t in host)
    frequencies = torch.bincount(torch.tensor(host), minlength=V).double() / NUM_DRAWS
    want = expected_distribution(params)
    assert torch.isfinite(want).all() and want.sum().item() == pytest.approx(1.0)
    assert torch.allclose(frequencies, want, atol=0.03), (frequencies, want)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path):
    return make_engine(tiny_llama_dir)


def generate(engine, prompt: list[int], params: SamplingParams) -> tuple[list[int], str]:
    engine.add_request("x", prompt, params)
    tokens, reason = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.new_token_ids
            reason = out.finish_reason if out.finished else reason
    return tokens, reason


@pytest.mark.parametrize(("params", "kind"), EDGES, ids=[str(p) for p, _ in EDGES])
def test_edge_values_through_the_engine(engine, params: dict, kind: str) -> None:
    prompt = random_prompts(1, engine.vocab_size, 12, 12, seed=31)[0]
    common = {"max_tokens": 6, "ignore_eos": True, "seed": 5}
    greedy, _ = generate(engine, prompt, SamplingParams(temperature=0.0, **common))
    tokens, reason = generate(engine, prompt, SamplingParams(**{**params, **common}))
    assert reason == "length" and len(tokens) == 6
    assert all(0 <= t < engine.vocab_size for t in tokens)
    if kind == "greedy" or params in ({"top_p": SUBNORMAL}, {"min_p": 1.0}, {"top_k": 1}):
        assert tokens == greedy  # only the most likely token is left to choose
    if params == {"temperature": GREEDY_TEMPERATURE}:
        assert tokens == greedy  # logits / 1e-5 leave one token all the probability
