"""Prompt logprobs (engine/prompt_logprobs.py) against transformers on the tiny Llama, fp32 on CPU: every prompt
token's logprob and top alternatives within 1e-4 of the log-softmax of transformers' full-sequence forward,
whether the prompt is prefilled in one step or in chunks beside other requests, after a preemption, with its
prefix cached by an earlier request, and with synchronous or async steps. Requests that do not ask get none and
cost the LM head nothing more."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.outputs import PromptLogprobs
from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import load_hf_reference
from tests.engine.engine_helpers import make_engine, random_prompts

ATOL = 1e-4
TOP = 4


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path):
    model = load_hf_reference(tiny_llama_dir)

    @torch.no_grad()
    def logprobs(prompt: list[int]) -> torch.Tensor:
        """[P - 1, V]: row i is the log-softmax predicting prompt token i + 1."""
        logits = model(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt))).logits[0].float()
        return torch.log_softmax(logits, dim=-1)[:-1]

    return logprobs


def run(engine, requests: dict[str, tuple[list[int], SamplingParams]], arrivals: dict[str, int] | None = None):
    """Adds each request at its arrival step; returns the prompt logprobs each output carried, per request id."""
    arrivals = arrivals or {}
    carried: dict[str, list[PromptLogprobs]] = {rid: [] for rid in requests}
    pending = sorted(requests, key=lambda rid: arrivals.get(rid, 0))
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and arrivals.get(pending[0], 0) <= step:
            rid = pending.pop(0)
            engine.add_request(rid, *requests[rid])
        for out in engine.step():
            assert out.finish_reason in (None, "stop", "length"), out
            if out.prompt_logprobs is not None:
                carried[out.request_id].append(out.prompt_logprobs)
        step += 1
    return carried


def assert_matches(got: PromptLogprobs, prompt: list[int], want: torch.Tensor, k: int) -> None:
    assert got.token_ids == prompt and len(got.logprobs) == len(prompt) - 1
    for i, lp in enumerate(got.logprobs):
        assert lp.token_id == prompt[i + 1]
        assert abs(lp.logprob - want[i, prompt[i + 1]].item()) < ATOL, (i, lp.logprob)
        values, indices = want[i].topk(k)
        assert sorted(lp.top) == sorted(indices.tolist()), i
        for token, value in zip(indices.tolist(), values.tolist(), strict=True):
            assert abs(lp.top[token] - value) < ATOL, (i, token)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_prompt_logprobs_match_transformers_in_one_step_and_in_chunks(
    tiny_llama_dir: Path, reference, async_scheduling
):
    prompts = random_prompts(4, 49152, 150, 220, seed=21)
    asks = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=TOP, ignore_eos=True)
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    # chunks of at most 64 tokens: each prompt spreads over steps shared with the others' chunks and decodes
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=64, async_scheduling=async_scheduling)
    requests = {
        "a": (prompts[0], asks),
        "b": (prompts[1], plain),
        "c": (prompts[2], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0, logprobs=2)),
        "one": ([prompts[3][0]], asks),  # a prompt of one token: nothing predicts it
    }
    carried = run(engine, requests, arrivals={"b": 0, "a": 1, "c": 2, "one": 3})
    assert carried["b"] == []
    (a,) = carried["a"]
    assert_matches(a, prompts[0], reference(prompts[0]), TOP)
    (c,) = carried["c"]
    assert_matches(c, prompts[2], reference(prompts[2]), 0)
    assert carried["one"] == [PromptLogprobs([prompts[3][0]], [])]
    whole = make_engine(tiny_llama_dir, max_num_batched_tokens=2048, async_scheduling=async_scheduling)
    (again,) = run(whole, {"a": (prompts[0], asks)})["a"]
    assert_matches(again, prompts[0], reference(prompts[0]), TOP)  # the whole prompt in one step
    assert not engine.live.prompt_logprob_ids and not whole.live.prompt_logprob_ids


def test_prompt_logprobs_skip_the_prefix_cache_and_survive_preemption(tiny_llama_dir: Path, reference):
    prompts = random_prompts(3, 49152, 200, 200, seed=22)
    asks = SamplingParams(temperature=0.0, max_tokens=40, prompt_logprobs=TOP, ignore_eos=True)
    # a pool of 544 tokens for three 240-token sequences: someone is preempted, prefills run in 64-token chunks
    engine = make_engine(tiny_llama_dir, num_kv_tokens=544, max_num_batched_tokens=64)
    carried = run(engine, {f"r{i}": (p, asks) for i, p in enumerate(prompts)})
    assert engine.stats().num_preemptions > 0
    for i, prompt in enumerate(prompts):
        (got,) = carried[f"r{i}"]
        assert_matches(got, prompt, reference(prompt), TOP)
    # the first prompt again, now in the prefix cache: computed anyway, and the same
    computed = engine.stats().num_prompt_tokens_computed
    (again,) = run(engine, {"again": (prompts[0], asks)})["again"]
    assert engine.stats().num_prompt_tokens_computed - computed == len(prompts[0])
    assert_matches(again, prompts[0], reference(prompts[0]), TOP)


def test_only_requests_that_ask_pay_for_prompt_logprobs(tiny_llama_dir: Path) -> None:
    """The LM head sees each sampling row, plus the prompt rows of the requests that ask, nothing else."""
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=2048)
    rows: list[int] = []
    head = engine.model.compute_logits

    def counted(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return head(hidden, *args, **kwargs)

    engine.model.compute_logits = counted
    prompts = random_prompts(2, 49152, 30, 30, seed=23)
    plain = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    run(engine, {"x": (prompts[0], plain), "y": (prompts[1], plain)})
    assert sum(rows) == 2 * 2  # two sampling rows a step, two steps
    rows.clear()
    run(engine, {"x": (prompts[0], plain), "y": (prompts[1], SamplingParams(max_tokens=2, prompt_logprobs=1))})
    assert sum(rows) == 2 * 2 + 29


def test_every_choice_of_n_gets_the_prompt_logprobs(tiny_llama_dir: Path, reference) -> None:
    prompt = random_prompts(1, 49152, 40, 40, seed=24)[0]
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=2048)
    params = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=2, prompt_logprobs=TOP, ignore_eos=True)
    engine.add_request("n2", prompt, params)
    carried = {}
    while engine.has_unfinished_requests():
        carried |= {out.index: out.prompt_logprobs for out in engine.step() if out.prompt_logprobs is not None}
    assert sorted(carried) == [0, 1]
    for got in carried.values():
        assert_matches(got, prompt, reference(prompt), TOP)
