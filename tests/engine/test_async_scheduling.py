"""Async scheduling: step k+1 is scheduled and launched before step k's tokens are read, and
a pending token reaches step k+1's input from the device. What any request gets must be
exactly what synchronous steps give it; what changes is only when outputs come back (one
call later) and that a request that stops may have one extra, dropped, step in flight.

On the CPU the engine runs the same code (the device gather of pending tokens, the padded
decode buffers of the CUDA graphs with capture=False); tests/engine/test_cuda_graphs.py runs
it with real graphs on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama; needs no GGUF conversion where the tokenizer was carried (GPU machine)."""
    return tiny_checkpoint_factory(request, tmp_path_factory)("llama")


def run_all(
    engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]], arrivals: list[int]
) -> dict[tuple[str, int], list[RequestOutput]]:
    """Adds request i before step arrivals[i]; returns every output, per (request id, choice)."""
    outputs: dict[tuple[str, int], list[RequestOutput]] = {}
    order = sorted(range(len(requests)), key=lambda i: arrivals[i])
    step = 0
    while order or engine.has_unfinished_requests():
        while order and arrivals[order[0]] <= step:
            engine.add_request(*requests[order.pop(0)])
        for out in engine.step():
            outputs.setdefault((out.request_id, out.index), []).append(out)
        step += 1
    return outputs


def summary(outputs: dict[tuple[str, int], list[RequestOutput]]) -> dict:
    """What a caller sees of each choice: tokens, text, finish reason, logprobs (rounded)."""
    result = {}
    for key, outs in outputs.items():
        logprobs = [(lp.token_id, round(lp.logprob, 4)) for o in outs for lp in (o.new_logprobs or [])]
        finished = [o for o in outs if o.finished]
        assert len(finished) == 1 and finished[0] is outs[-1], key
        result[key] = (
            [t for o in outs for t in o.new_token_ids],
            "".join(o.new_text for o in outs),
            outs[-1].finish_reason,
            logprobs,
        )
    return result


def mixed_workload(vocab_size: int, eos: int) -> tuple[list[tuple[str, list[int], SamplingParams]], list[int]]:
    prompts = random_prompts(12, vocab_size, 3, 90, seed=21)
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=18, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True),
        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=9, ignore_eos=True),
        # EOS made certain from the 5th token on: a stop by token that async learns one step late
        SamplingParams(temperature=0.0, max_tokens=30, min_tokens=4, logit_bias={eos: 100.0}),
        SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True, stop_token_ids=[prompts[6][0]]),
        SamplingParams(temperature=0.7, seed=11, max_tokens=15, ignore_eos=True, min_p=0.05),
        SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=22, ignore_eos=True),
    ]
    requests = [(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    return requests, [0, 0, 1, 1, 2, 3, 5, 8, 8, 9, 13, 20]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "padded-decode"])
def test_async_gives_the_sync_outputs(model_dir: Path, graphs: bool) -> None:
    """Greedy, seeded random, logprobs, n = 2, min_tokens + EOS, stop ids, max_tokens of 1 and 2,
    staggered arrivals and chunked prefill (a 64-token budget) in one run each way."""
    sync = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=8)
    requests, arrivals = mixed_workload(sync.vocab_size, min(sync.eos_token_ids))
    expected = summary(run_all(sync, requests, arrivals))
    engine = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=8, async_scheduling=True)
    if graphs:
        engine.runner.enable_graphs(capture=False)
    got = summary(run_all(engine, requests, arrivals))
    assert got == expected
    assert expected[("r5", 0)][2] == "stop" and len(expected[("r5", 0)][0]) == 5  # the EOS stop did happen
    if graphs:
        assert engine.runner.graphs.num_replays > 20
    assert engine.runner.inputs.num_pending_staged > 20  # inputs read from the step before on the device
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and not engine.has_unfinished_requests()


def test_outputs_come_one_call_later_and_a_request_is_never_scheduled_past_max_tokens(model_dir: Path) -> None:
    engine = make_engine(model_dir, async_scheduling=True)
    prompt = random_prompts(1, engine.vocab_size, 10, 10, seed=2)[0]
    engine.add_request("x", prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    per_call, scheduled = [], []
    while engine.has_unfinished_requests():
        per_call.append(sum(len(o.new_token_ids) for o in engine.step()))
        scheduled.append(engine.last_step.scheduled.get("x", 0))
    # Call 1 launches the prefill and returns nothing; calls 2-3 launch the decodes and return the
    # previous step's token; call 4 launches nothing (the 3rd token is the last allowed) and reads.
    assert per_call == [0, 1, 1, 1]
    assert scheduled == [10, 1, 1, 0]


def test_a_stop_found_late_drops_the_extra_token(model_dir: Path) -> None:
    """A stop by token is learnt after the next step is launched: that step computes one more
    token for the request, which nobody sees."""
    engine = make_engine(model_dir, async_scheduling=True)
    eos = min(engine.eos_token_ids)
    prompt = random_prompts(1, engine.vocab_size, 10, 10, seed=4)[0]
    engine.add_request(
        "x", prompt, SamplingParams(temperature=0.0, max_tokens=30, min_tokens=2, logit_bias={eos: 100.0})
    )
    outputs, launches = [], 0
    while engine.has_unfinished_requests():
        outputs += engine.step()
        launches += "x" in engine.last_step.scheduled
    assert [o.new_token_ids for o in outputs] == [[outputs[0].new_token_ids[0]], [outputs[1].new_token_ids[0]], [eos]]
    assert outputs[-1].finish_reason == "stop" and outputs[-1].num_output_tokens == 3
    assert launches == 4  # prefill, two decodes, and the dropped one
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and stats.num_generated_tokens == 3


def test_abort_while_its_step_is_in_flight(model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    prompts = random_prompts(2, 49152, 20, 20, seed=6)
    sync = make_engine(model_dir)
    expected = summary(run_all(sync, [("keep", prompts[0], params)], [0]))
    engine = make_engine(model_dir, async_scheduling=True)
    engine.add_request("keep", prompts[0], params)
    engine.add_request("gone", prompts[1], params)
    seen: dict[str, list[RequestOutput]] = {"keep": [], "gone": []}
    for _ in range(3):
        for out in engine.step():
            seen[out.request_id].append(out)
    assert "gone" in engine.last_step.scheduled  # launched, its token not read yet
    aborted = engine.abort_request("gone")
    assert [o.finish_reason for o in aborted] == ["abort"]
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    assert len(seen["gone"]) == 2  # the tokens read before the abort, none after it
    assert summary({("keep", 0): seen["keep"]}) == expected
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_penalties_make_steps_synchronous_while_such_a_request_runs(model_dir: Path) -> None:
    """Penalties read a request's earlier tokens on the host, so its steps cannot run ahead of them."""
    penalized = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, repetition_penalty=1.3)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = random_prompts(2, 49152, 8, 8, seed=8)
    requests = [("pen", prompts[0], penalized), ("plain", prompts[1], greedy)]
    expected = summary(run_all(make_engine(model_dir), requests, [0, 0]))
    engine = make_engine(model_dir, async_scheduling=True)
    for request in requests:
        engine.add_request(*request)
    per_call = []
    outputs: dict[tuple[str, int], list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        step_outputs = engine.step()
        per_call.append(sorted(o.request_id for o in step_outputs))
        for out in step_outputs:
            outputs.setdefault((out.request_id, out.index), []).append(out)
    assert summary(outputs) == expected
    # Synchronous while "pen" runs (each call returns its own step's tokens), overlapped after:
    # the call after pen's last one returns nothing new for "plain" only one call late.
    assert per_call[:5] == [["pen", "plain"]] * 5
    assert per_call[5] == [] and per_call[6:] == [["plain"]] * 7


def test_sampling_without_logprobs_is_read_a_step_later(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Temperature, top-p, min-p, seeds, bias and min_tokens are sampled on the device and read
    like greedy tokens (a step later, no sync at launch); only logprobs take the host path."""
    from engine.sampler import Sampler

    prompts = random_prompts(5, 49152, 4, 40, seed=8)
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=10, ignore_eos=True, seed=9),
        SamplingParams(temperature=0.6, min_p=0.1, seed=2, max_tokens=12, min_tokens=6),
        SamplingParams(temperature=0.0, max_tokens=11, ignore_eos=True, logit_bias={prompts[3][0]: 3.0}),
        SamplingParams(temperature=0.8, seed=4, max_tokens=9, ignore_eos=True, logprobs=2),
    ]
    requests = [(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    arrivals = [0, 0, 2, 3, 12]  # r4 (logprobs) joins once the others ran many steps without it
    expected = summary(run_all(make_engine(model_dir, max_num_seqs=8), requests, arrivals))
    host_path_rows: list[list[str]] = []
    host_path = Sampler.__call__

    def spy(self, logits, batch):
        host_path_rows.append([r.request_id for r in batch])
        return host_path(self, logits, batch)

    monkeypatch.setattr(Sampler, "__call__", spy)
    engine = make_engine(model_dir, max_num_seqs=8, async_scheduling=True)
    assert summary(run_all(engine, requests, arrivals)) == expected
    assert host_path_rows and all("r4" in rows for rows in host_path_rows)  # only steps with the logprobs request
