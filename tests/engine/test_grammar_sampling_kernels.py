"""Constrained rows on the sampling kernels (engine/sampler.py's sample_packed with a grammar's mask): the
bitmask goes over the logits in place, then kernels/random_sample.py or kernels/greedy_sample.py choose with
-inf taken as a forbidden token. They give the tokens of the torch path (Sampler.__call__, which widens the
logits and masks them itself), every token is one its grammar allows, and a fault the mask leaves standing
is still caught.
Real xgrammar grammars over the packaged SmolLM2 tokenizer; the kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from engine import ops
from engine.request import Request
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.structured_output.compiler import GrammarCompileService
from engine.structured_output.constraint import constraint_key
from engine.structured_output.grammar_state import GrammarState

CONSTRAINTS = [{"regex": r"[a-z]{3,8}( [a-z]{3,8}){2,5}\."}, {"choice": ["yes", "no", "maybe"]},
               {"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}]  # fmt: skip


@pytest.fixture(scope="module")
def compiled(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    service = GrammarCompileService(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield len(tokenizer), [service.compile_now(constraint_key(c)) for c in CONSTRAINTS]
    service.shutdown()


@pytest.fixture
def triton_kernels():
    previous = ops.get_kernel_backend()
    ops.set_kernel_backend("triton")
    yield
    ops.set_kernel_backend(previous)


def _requests(compiled_grammars, params: list[SamplingParams]) -> list[Request]:
    """One request per params; the first len(compiled_grammars) carry a grammar, the rest are free."""
    requests = []
    for row, p in enumerate(params):
        request = Request(f"r{row}", [1, 2, 3], p, frozenset({0}), seed=100 + row)
        if row < len(compiled_grammars):
            request.grammar = GrammarState(compiled_grammars[row])
        requests.append(request)
    return requests


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    # coarse steps (1/64): no chance ties among the top tokens; bf16 as the LM head gives them
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=gen) * 3).mul(64).round().div(64).to(torch.bfloat16)


def _allowed(request: Request, token: int) -> bool:
    return request.grammar.accept(token)


@pytest.mark.parametrize(
    "params",
    [
        [SamplingParams(temperature=0.0)] * 3,  # every row greedy: the greedy kernel
        [
            SamplingParams(temperature=0.8),
            SamplingParams(temperature=1.0, top_p=0.9),
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.7, top_k=20),
        ],  # fmt: skip
    ],
    ids=["greedy", "mixed"],
)
def test_masked_kernels_choose_the_torch_paths_tokens(compiled, triton_kernels, params):
    vocab, grammars = compiled
    for seed in range(3):
        logits = _logits(len(params), vocab, seed)
        torch_path = Sampler()(logits.clone(), _requests(grammars, params))
        assert torch_path.errors == [None] * len(params)
        requests = _requests(grammars, params)
        packed = Sampler().sample_packed(logits.clone(), requests)
        assert packed[1].tolist() == [1] * len(params)
        assert packed[0].tolist() == torch_path.token_ids
        assert all(_allowed(r, t) for r, t in zip(requests[: len(grammars)], packed[0].tolist()))


def test_a_fault_in_a_constrained_row_is_still_caught(compiled, triton_kernels):
    """A NaN or +inf the mask leaves standing fails its row alone (a NaN hidden state makes every logit NaN);
    one at a token the grammar forbids is overwritten by the mask, as it could never be chosen."""
    vocab, grammars = compiled
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9), SamplingParams(temperature=0.9)]
    logits = _logits(3, vocab, 7)
    logits[0] = float("nan")
    logits[1] = float("inf")
    packed = Sampler().sample_packed(logits, _requests(grammars, params))
    assert packed[1].tolist() == [0, 0, 1]
    logits = _logits(3, vocab, 8)
    logits[1] = float("nan")
    greedy = Sampler().sample_packed(logits, _requests(grammars, [SamplingParams(temperature=0.0)] * 3))
    assert greedy[1].tolist() == [1, 0, 1]
