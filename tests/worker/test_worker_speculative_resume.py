"""A worker process speculating with prompt lookup is killed (-9) mid-generation; a speculating survivor resumes
its requests from the tokens already written. Greedy and seeded requests end with exactly the tokens a
non-speculative engine produces, and the survivor's /metrics count its speculation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig
from engine.config import SpeculativeConfig
from tests.worker.harness import (
    ProcessWorker,
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

TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick "
    "daft zebras jump. The five boxing wizards jump quickly. Sphinx of black quartz, judge my vow."
)


def _engine(model_dir: Path, speculative: SpeculativeConfig) -> LLMEngine:
    config = EngineConfig(
        # sampling defaults off, as in the worker below: the offline reference takes the params as given
        model=ModelConfig(str(model_dir), dtype="float32", max_model_len=256, generation_defaults="none"),
        cache=CacheConfig(num_kv_tokens=4096),
        device="cpu",
        speculative=speculative,
    )
    return LLMEngine(config)


def _wait_events(client, keys, requests, at_least: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(len(read_events(client, keys, rid)) >= at_least for rid in requests):
        assert time.monotonic() < deadline, "requests did not start"
        time.sleep(0.01)


def test_kill_9_mid_speculation_resumes_to_the_same_tokens(redis_server, prefix, smollm2_dir, tmp_path):
    keys, client = Keys(prefix), redis_server.client()
    plain = _engine(smollm2_dir, SpeculativeConfig())
    prompt = plain.apply_chat_template([{"role": "user", "content": f"Repeat exactly: {TEXT}"}])
    common = {"max_tokens": 64, "ignore_eos": True}
    requests = {
        "greedy": (prompt, {"temperature": 0, **common}),
        "seeded": (prompt, {"temperature": 0.6, "top_p": 0.9, "seed": 7, **common}),
        "pair": (prompt, {"temperature": 0.5, "seed": 8, "n": 2, **common}),
    }
    settings = make_settings(
        redis_server, prefix, smollm2_dir, speculative_method="ngram", lease_ms=1500, generation_defaults="none"
    )
    survivor_engine = _engine(smollm2_dir, SpeculativeConfig(method="ngram"))
    with ProcessWorker(settings, tmp_path / "victim.log") as victim:
        victim_name = victim.wait_ready(client, keys)
        for request_id, (prompt_ids, params) in requests.items():
            submit(client, keys, request_id, prompt_token_ids=prompt_ids, params=params)
        _wait_events(client, keys, requests, 1)  # the victim holds all three
        with ThreadWorker(settings, engine=survivor_engine) as survivor:
            _wait_events(client, keys, requests, 2)
            victim.kill()
            written = {rid: read_events(client, keys, rid) for rid in requests}
            for request_id, events in written.items():
                tokens = sum(len(e.token_ids) for _, e in events if e.type == "token")
                assert tokens < 64 * requests[request_id][1].get("n", 1), f"{request_id} finished before the kill"
            results = {
                rid: wait_complete(client, keys, [rid], n=params.get("n", 1), timeout_s=90)[rid]
                for rid, (_, params) in requests.items()
            }
            survivor_name = survivor.worker.consumer
            registry = survivor.worker.metrics.registry
    expected = offline_outputs(plain, requests)
    for request_id, (_, params) in requests.items():
        events = assert_exactly_once(client, keys, request_id, n=params.get("n", 1))
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
        assert {e.worker for e in events[: len(written[request_id])]} == {victim_name}
        assert events[-1].worker == survivor_name  # the survivor finished what the victim started
    drafts = registry.get_sample_value("inferq_spec_decode_num_drafts_total")
    accepted = registry.get_sample_value("inferq_spec_decode_num_accepted_tokens_total")
    first = registry.get_sample_value("inferq_spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"})
    assert drafts > 0 and accepted > 0 and first > 0
    assert survivor_engine.speculator.stats.num_accepted_tokens == accepted
