"""One request's failure inside the engine ends that request alone: every other stream generating beside it
(another tenant's too) completes exactly as it would have. And the value that once broke every request in
its step (top_k of 2**63) no longer reaches the engine: the protocol dead-letters it.

A real worker in a thread, a real private Redis, the tiny Llama on CPU.
"""

from __future__ import annotations

import time

import pytest

from tests.worker.harness import (
    ThreadWorker,
    assert_exactly_once,
    make_settings,
    offline_outputs,
    read_events,
    submit,
    tokens_by_index,
    wait_complete,
)
from worker.protocol import Keys

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def engine(request, worker_model_dir):
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SchedulerConfig

    config = EngineConfig(
        model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
        cache=CacheConfig(num_kv_tokens=4096),
        scheduler=SchedulerConfig(max_num_seqs=32),
        device="cpu",
        async_scheduling=request.param,
    )
    return LLMEngine(config)


def test_a_request_that_breaks_its_steps_fails_alone(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    requests = {
        f"other-{i}": (
            engine.encode(f"Request {i}: tell me about the sea"),
            {"temperature": 0, "max_tokens": 30, "ignore_eos": True}
            if i % 2
            else {"temperature": 0.8, "top_p": 0.9, "seed": i, "max_tokens": 30, "ignore_eos": True},
        )
        for i in range(4)
    }
    expected = offline_outputs(engine, requests)
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        for request_id, (prompt_ids, params) in requests.items():
            submit(client, keys, request_id, prompt_token_ids=prompt_ids, params=params)
        submit(client, keys, "culprit", prompt="A request gone wrong", params={"max_tokens": 60, "ignore_eos": True})
        deadline = time.monotonic() + 30
        while not all(read_events(client, keys, rid) for rid in [*requests, "culprit"]):
            assert time.monotonic() < deadline, "not every request started"
            time.sleep(0.01)
        # Its parameters go bad after validation (a bug, not a caller, could do this): every launch of a step
        # that holds it raises in the sampler, from the next step on.
        engine.requests["culprit"].sampling_params.temperature = "hot"
        # The probe's request of 2026-11-28: the protocol refuses it before any engine sees it.
        submit(client, keys, "huge-top-k", prompt="x", params={"top_k": 2**63, "max_tokens": 4})
        results = wait_complete(client, keys, [*requests, "culprit", "huge-top-k"])
        assert client.xpending(keys.requests, keys.group)["pending"] == 0

    for request_id in requests:
        events = assert_exactly_once(client, keys, request_id)
        assert tokens_by_index(events) == expected[request_id], request_id
        assert events[-1].type == "done" and events[-1].finish_reason == "length"
    culprit = results["culprit"]
    assert culprit[-1].type == "error" and culprit[-1].error.startswith("TypeError"), culprit[-1]
    assert 0 < len(tokens_by_index(culprit).get(0, [])) < 60
    ((_, letter),) = client.xrange(keys.dead)
    assert letter[b"id"] == b"huge-top-k"
    reason = letter[b"reason"].decode()
    assert reason == ("invalid message: params.top_k: must be an integer in [-1, 2**31 - 1], got 9223372036854775808")
    assert [e.type for e in results["huge-top-k"]] == ["error"] and results["huge-top-k"][0].error == reason
