"""Engine behaviour on a tiny Llama: prefix caching, chunked prefill, preemption, seeded
sampling and resumption, n > 1, stop strings, abort, and bad input. Every test runs with
synchronous steps and with async scheduling (step k+1 launched before step k's tokens are
read), which must not change what any request gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts, run_staggered

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def engine(request: pytest.FixtureRequest, tiny_llama_dir: Path):
    return make_engine(tiny_llama_dir, max_num_batched_tokens=2048, async_scheduling=request.param)


def like(engine, model_dir: Path, **kwargs):
    """Another engine over the same checkpoint, in the same scheduling mode as `engine`."""
    return make_engine(model_dir, async_scheduling=engine.async_scheduling, **kwargs)


def generate(engine, prompt: list[int], params: SamplingParams, request_id: str = "x", **kwargs) -> list[int]:
    engine.add_request(request_id, prompt, params, **kwargs)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


def test_prefix_cache_computes_only_the_suffix_and_keeps_tokens(tiny_llama_dir: Path, engine) -> None:
    prefix, first_suffix, suffix = random_prompts(3, engine.vocab_size, 512, 512, seed=3)
    first_suffix, suffix = first_suffix[:40], suffix[:37]
    generate(engine, prefix + first_suffix, GREEDY, "first")
    before = engine.stats().num_prompt_tokens_computed
    engine.add_request("second", prefix + suffix, GREEDY)
    request = engine.requests["second"]
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    assert request.num_cached_tokens == 512
    assert engine.stats().num_prompt_tokens_computed - before == len(suffix)
    uncached = like(engine, tiny_llama_dir, enable_prefix_caching=False)
    assert tokens == generate(uncached, prefix + suffix, GREEDY)


def test_chunked_prefill_gives_the_same_tokens(tiny_llama_dir: Path, engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 300, 300, seed=4)[0]
    small_budget = like(engine, tiny_llama_dir, max_num_batched_tokens=64, enable_prefix_caching=False)
    chunks = []
    small_budget.add_request("x", prompt, GREEDY)
    tokens = []
    while small_budget.has_unfinished_requests():
        small_budget.step()
        chunks.append(small_budget.last_step.scheduled.get("x"))
        tokens.extend(
            small_budget.requests["x"].output_token_ids[len(tokens) :] if "x" in small_budget.requests else []
        )
    assert chunks[:5] == [64, 64, 64, 64, 44]  # 300 tokens in budget-sized chunks
    big = like(engine, tiny_llama_dir, max_num_batched_tokens=4096, enable_prefix_caching=False)
    reference = generate(big, prompt, GREEDY)
    again = like(engine, tiny_llama_dir, max_num_batched_tokens=64, enable_prefix_caching=False)
    assert generate(again, prompt, GREEDY) == reference


def test_preemption_completes_every_request_with_the_same_tokens(tiny_llama_dir: Path, engine) -> None:
    prompts = random_prompts(6, engine.vocab_size, 20, 60, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ample = run_staggered(like(engine, tiny_llama_dir), prompts, params)
    tight = like(engine, tiny_llama_dir, num_kv_tokens=16 * 12)  # 12 blocks: far less than 6 x ~6 blocks
    squeezed = run_staggered(tight, prompts, params)
    assert tight.stats().num_preemptions > 0
    assert squeezed == ample
    assert tight.stats().num_free_blocks == tight.stats().num_total_blocks


def test_seeded_sampling_repeats_and_resumes_exactly(engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 10, 10, seed=6)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=30, ignore_eos=True)
    first = generate(engine, prompt, params, "a")
    assert generate(engine, prompt, params, "b") == first
    other = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=99, max_tokens=30, ignore_eos=True)
    assert generate(engine, prompt, other, "c") != first
    for k in (1, 7, 29):
        rest = generate(engine, prompt, params, f"resume{k}", prior_output_token_ids=first[:k])
        assert first[:k] + rest == first, f"resumed after {k} tokens"


def test_n_choices_share_the_prompt_and_differ(engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 40, 40, seed=7)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    engine.add_request("multi", prompt, params)
    choices: dict[int, list[int]] = {0: [], 1: [], 2: []}
    finished = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "multi"
            choices[out.index].extend(out.new_token_ids)
            if out.finished:
                finished.add(out.index)
    assert finished == {0, 1, 2} and all(len(c) == 12 for c in choices.values())
    assert len({tuple(c) for c in choices.values()}) == 3
    # Choice 0 equals the n = 1 request with the same seed.
    single = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    assert generate(engine, prompt, single, "single") == choices[0]


def test_stop_string_ends_output_and_is_not_included(engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 12, 12, seed=8)[0]
    free = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine.add_request("free", prompt, free)
    text = ""
    while engine.has_unfinished_requests():
        text += "".join(o.new_text for o in engine.step())
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    engine.add_request("stopped", prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop]))
    out_text, reason = "", None
    while engine.has_unfinished_requests():
        for o in engine.step():
            out_text += o.new_text
            reason = o.finish_reason or reason
    assert reason == "stop"
    assert out_text == text[: text.index(stop)]


def test_abort_frees_blocks_at_once(engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 100, 100, seed=9)[0]
    total = engine.stats().num_total_blocks
    engine.add_request("gone", prompt, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.stats().num_free_blocks < total
    outs = engine.abort_request("gone")
    assert [o.finish_reason for o in outs] == ["abort"]
    assert engine.stats().num_free_blocks == total and not engine.has_unfinished_requests()


def test_max_tokens_and_eos_finish_reasons(engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 8, 8, seed=10)[0]
    engine.add_request("len", prompt, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    assert [len(o.new_token_ids) for o in outs] == [1] * 5
    assert outs[-1].finished and outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 5
    eos = min(engine.eos_token_ids)
    engine.add_request("eos", prompt, SamplingParams(temperature=0.0, max_tokens=5, logit_bias={eos: 100.0}))
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    assert outs[-1].finish_reason == "stop" and outs[-1].num_output_tokens == 1


def test_logprobs_flow_through_the_engine(engine) -> None:
    prompt = random_prompts(1, engine.vocab_size, 8, 8, seed=11)[0]
    engine.add_request("lp", prompt, SamplingParams(temperature=0.0, max_tokens=3, logprobs=4, ignore_eos=True))
    lps = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            lps.extend(o.new_logprobs or [])
    assert len(lps) == 3 and all(len(lp.top) == 4 and lp.logprob <= 0 for lp in lps)
    assert all(lp.token_id == max(lp.top, key=lp.top.get) for lp in lps)  # greedy picks the top one


def test_bad_input_names_field_and_limit(tiny_llama_dir: Path, engine) -> None:
    engine = like(engine, tiny_llama_dir, max_model_len=64)
    with pytest.raises(ValueError, match=r"prompt is 64 tokens, but max_model_len is 64"):
        engine.add_request("a", [5] * 64, SamplingParams())
    too_long = r"max_tokens \(60\) plus the prompt \(10 tokens\) exceeds max_model_len \(64\)"
    with pytest.raises(ValueError, match=too_long):
        engine.add_request("b", [5] * 10, SamplingParams(max_tokens=60))
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] = 999999 is outside the vocabulary"):
        engine.add_request("c", [5, 999999], SamplingParams())
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request("d", [], SamplingParams())
    engine.add_request("e", [5] * 10, SamplingParams(max_tokens=54))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("e", [5] * 10, SamplingParams())
    assert engine.stats().num_waiting == 1


def test_context_limit_finishes_with_length(tiny_llama_dir: Path, engine) -> None:
    engine = like(engine, tiny_llama_dir, max_model_len=32)
    tokens = generate(engine, [7] * 20, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
    assert len(tokens) == 12
