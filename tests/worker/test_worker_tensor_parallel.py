"""A worker serving with tensor parallelism (2 ranks, gloo on CPU) loses a rank mid-generation: the worker
process exits at once (code 3, naming the rank), and a survivor resumes its requests from the tokens already
written. Greedy and seeded requests end with exactly the tokens one engine of one rank produces, each token
written once."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig
from engine.parallel.launch import RANK_DIED_EXIT_CODE
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

pytestmark = pytest.mark.timeout(240)
MAX_TOKENS = 96


def _engine(model_dir: Path) -> LLMEngine:
    config = EngineConfig(
        model=ModelConfig(str(model_dir), dtype="float32", max_model_len=256, generation_defaults="none"),
        cache=CacheConfig(num_kv_tokens=4096),
        device="cpu",
    )
    return LLMEngine(config)


def _rank_pids(log: str) -> list[int]:
    """The pids of ranks 1..N-1, as each logs when it is ready (engine/parallel/follower.py)."""
    return [int(pid) for pid in re.findall(r"rank \d+ of \d+ \(pid (\d+)\) ready", log)]


def test_a_dead_rank_ends_its_worker_and_a_survivor_resumes_the_requests(
    redis_server, prefix, tiny_checkpoint, tmp_path
):
    model_dir = tiny_checkpoint("llama")
    keys, client = Keys(prefix), redis_server.client()
    prompt = [5, 17, 99, 1234, 4321, 77, 8]
    common = {"max_tokens": MAX_TOKENS, "ignore_eos": True}
    requests = {
        "greedy": (prompt, {"temperature": 0, **common}),
        "seeded": (prompt, {"temperature": 0.7, "top_p": 0.9, "seed": 11, **common}),
    }
    settings = make_settings(redis_server, prefix, model_dir, tensor_parallel_size=2, generation_defaults="none")
    survivor_settings = make_settings(redis_server, prefix, model_dir, generation_defaults="none")
    with ProcessWorker(settings, tmp_path / "victim.log") as victim:
        victim_name = victim.wait_ready(client, keys)
        ranks = _rank_pids(victim.log_text())
        assert len(ranks) == 1, f"expected one rank process beside rank 0, found {ranks}"
        for request_id, (prompt_ids, params) in requests.items():
            submit(client, keys, request_id, prompt_token_ids=prompt_ids, params=params)
        deadline = time.monotonic() + 60
        while not all(len(read_events(client, keys, rid)) >= 3 for rid in requests):
            assert time.monotonic() < deadline, "requests did not start"
            time.sleep(0.01)
        os.kill(ranks[0], signal.SIGKILL)
        assert victim.process.wait(timeout=30) == RANK_DIED_EXIT_CODE
        assert "tensor parallel rank 1 exited" in victim.log_text()
        written = {rid: read_events(client, keys, rid) for rid in requests}
        for request_id, events in written.items():
            tokens = sum(len(e.token_ids) for _, e in events if e.type == "token")
            assert tokens < MAX_TOKENS, f"{request_id} finished before the rank died"
        with ThreadWorker(survivor_settings, engine=_engine(model_dir)) as survivor:
            results = {rid: wait_complete(client, keys, [rid], timeout_s=120)[rid] for rid in requests}
            survivor_name = survivor.worker.consumer
    expected = offline_outputs(_engine(model_dir), requests)
    for request_id in requests:
        events = assert_exactly_once(client, keys, request_id, n=1)
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
        assert {e.worker for e in events[: len(written[request_id])]} == {victim_name}
        assert events[-1].worker == survivor_name
