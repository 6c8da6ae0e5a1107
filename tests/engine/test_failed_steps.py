"""A step that fails because of one request fails that request alone: the engine runs the step again one
request at a time, and every other request gets exactly the tokens it gets in a run without the culprit.

The culprit is a request whose SamplingParams are corrupted after validation (nothing a caller can send
does this any more; a bug could): its launch raises inside the sampler. A failure while reading a step's
tokens (a device fault, which a CPU cannot produce) is injected at the runner's boundary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint_factory(request, tmp_path_factory)("llama")


MODES = {
    "sync": dict(async_scheduling=False),
    "async": dict(async_scheduling=True),
    "async-padded-decode": dict(async_scheduling=True, graphs=True),
}


def build(model_dir: Path, mode: str) -> LLMEngine:
    options = dict(MODES[mode])
    graphs = options.pop("graphs", False)
    engine = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=8, **options)
    if graphs:
        engine.runner.enable_graphs(capture=False)
    return engine


def workload(vocab_size: int) -> tuple[dict[str, tuple[list[int], SamplingParams, int]], list[int]]:
    """request id -> (prompt, params, arrival step), and the prefix the culprit shares with two others
    (two full blocks of 16: the prefix cache must not keep anything of the culprit's failed steps)."""
    prefix = random_prompts(1, vocab_size, 32, 32, seed=40)[0]
    prompts = random_prompts(8, vocab_size, 5, 40, seed=41)
    common = dict(ignore_eos=True)
    requests = {
        "greedy": (prompts[0], SamplingParams(temperature=0.0, max_tokens=14, **common), 0),
        "seeded": (prompts[1], SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=12, **common), 0),
        "shares-prefix": (prefix + prompts[2][:7], SamplingParams(temperature=0.0, max_tokens=10, **common), 0),
        "logprobs": (prompts[3], SamplingParams(temperature=0.0, max_tokens=9, logprobs=2, **common), 1),
        "n2": (prompts[4], SamplingParams(n=2, temperature=1.0, seed=9, max_tokens=8, **common), 2),
        "top-k": (prompts[5], SamplingParams(temperature=0.7, top_k=20, min_p=0.05, seed=4, max_tokens=11), 3),
        "after": (prefix + prompts[6][:9], SamplingParams(temperature=0.0, max_tokens=8, **common), 9),
    }  # fmt: skip
    return requests, prefix + prompts[7][:5]


def run(
    engine: LLMEngine,
    requests: dict[str, tuple[list[int], SamplingParams, int]],
    culprit: tuple[list[int], SamplingParams, int, int] | None = None,
) -> dict[tuple[str, int], tuple[list[int], str | None, str | None]]:
    """Runs the requests (and the culprit: prompt, params, arrival step, step before which its params are
    corrupted); returns each choice's (tokens, finish reason, error)."""
    arrivals = [(step, rid, prompt, params) for rid, (prompt, params, step) in requests.items()]
    if culprit is not None:
        arrivals.append((culprit[2], "culprit", culprit[0], culprit[1]))
    arrivals.sort(key=lambda a: a[0])
    got: dict[tuple[str, int], tuple[list[int], str | None, str | None]] = {}
    step = 0
    while arrivals or engine.has_unfinished_requests():
        while arrivals and arrivals[0][0] <= step:
            _, rid, prompt, params = arrivals.pop(0)
            engine.add_request(rid, prompt, params)
        if culprit is not None and step == culprit[3]:
            culprit[1].temperature = "hot"  # a launch with this request raises TypeError in the sampler
        for out in engine.step():
            tokens, reason, error = got.get((out.request_id, out.index), ([], None, None))
            assert reason is None, f"{out.request_id} has output after it finished"
            got[(out.request_id, out.index)] = (tokens + out.new_token_ids, out.finish_reason, out.error)
        step += 1
        assert step < 500
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and not engine.has_unfinished_requests()
    return got


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("corrupt_at", [0, 5], ids=["in-its-prefill", "mid-decode"])
def test_a_failing_launch_fails_its_culprit_alone(model_dir: Path, mode: str, corrupt_at: int) -> None:
    engine = build(model_dir, mode)
    requests, culprit_prompt = workload(engine.vocab_size)
    expected = run(build(model_dir, mode), requests)
    culprit = SamplingParams(temperature=0.8, seed=1, max_tokens=30, ignore_eos=True)
    got = run(engine, requests, (culprit_prompt, culprit, 0, corrupt_at))
    tokens, reason, error = got.pop(("culprit", 0))
    assert reason == "error" and error.startswith("TypeError"), error
    assert (tokens == []) == (corrupt_at == 0), tokens  # mid-decode: the tokens read before it broke
    assert got == expected
    assert all(reason == "length" for _, reason, _ in expected.values()) and len(expected) == 8


@pytest.mark.parametrize("mode", list(MODES))
def test_a_failing_read_fails_its_culprit_alone(model_dir: Path, mode: str) -> None:
    """Reading a step's tokens raises whenever the culprit samples in it: under async scheduling the step
    launched after it (which took the culprit's and the others' pending tokens from it) is undone too."""
    engine = build(model_dir, mode)
    requests, culprit_prompt = workload(engine.vocab_size)
    expected = run(build(model_dir, mode), requests)
    culprit = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    launch = engine.runner.launch
    failed_reads = []

    def launch_with_a_faulty_read(sched, **kwargs):
        launched = launch(sched, **kwargs)
        culprit_rows = [r for r in launched.requests if r.request_id == "culprit"]
        if culprit_rows and culprit_rows[0].num_output_tokens + culprit_rows[0].num_pending_tokens >= 3:
            # the step samples the culprit's 4th token (its pending one counted at launch)

            def read():
                failed_reads.append(len(launched.requests))
                raise RuntimeError("device fault while reading the step's tokens")

            launched._read = read
        return launched

    engine.runner.launch = launch_with_a_faulty_read
    got = run(engine, requests, (culprit_prompt, culprit, 0, -1))
    tokens, reason, error = got.pop(("culprit", 0))
    assert reason == "error" and error == "RuntimeError: device fault while reading the step's tokens"
    assert len(tokens) == 3
    assert failed_reads[0] > 1 and failed_reads[-1] == 1  # the batch's read, then the culprit's own step
    assert got == expected


def test_a_corrupted_top_k_is_clamped_to_the_vocabulary(model_dir: Path) -> None:
    """top_k past anything the limits allow (2**63: the 2026-11 probe's value, once refused only by the API)
    no longer fails even when it reaches the sampler: it keeps the whole vocabulary, as top_k -1 does."""
    engine = make_engine(model_dir)
    prompts = random_prompts(2, engine.vocab_size, 9, 9, seed=45)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    wide = SamplingParams(temperature=0.9, seed=2, max_tokens=8, ignore_eos=True)
    wide.top_k = 2**63
    plain = SamplingParams(temperature=0.9, seed=2, max_tokens=8, ignore_eos=True)
    got = run(engine, {"wide": (prompts[0], wide, 0), "greedy": (prompts[1], greedy, 0)})
    expected = run(make_engine(model_dir), {"wide": (prompts[0], plain, 0), "greedy": (prompts[1], greedy, 0)})
    assert got == expected and got[("wide", 0)][1] == "length"
