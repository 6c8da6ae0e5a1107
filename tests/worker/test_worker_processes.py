"""Real `python -m worker` processes: a plain client, kill -9 with a takeover, two healthy workers
sharing the queue exactly once, and SIGTERM hand-off."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.redis_server import free_port
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

# A client in any language: plain redis-py, nothing from inferq (run with `python -I`, so the
# repository is not even importable).
PLAIN_CLIENT = r"""
import json, sys, time
import redis

r = redis.Redis.from_url(sys.argv[1])
prefix, request_id = sys.argv[2], sys.argv[3]
live = r.pubsub()
live.subscribe(f"{prefix}:events:{request_id}")
live.get_message(timeout=1)  # the subscribe confirmation
r.xadd(f"{prefix}:requests", {
    "v": "1", "id": request_id, "prompt": "Once upon a time",
    "params": json.dumps({"temperature": 0, "max_tokens": 6}),
})
published, deadline = [], time.time() + 60
while time.time() < deadline:
    message = live.get_message(timeout=0.1)
    if message and message["type"] == "message":
        published.append(json.loads(message["data"]))
        if published[-1]["type"] in ("done", "error"):
            break
stream = [{k.decode(): v.decode() for k, v in f.items()} for _, f in r.xrange(f"{prefix}:result:{request_id}")]
print(json.dumps({"stream": stream, "published": published}))
"""


@pytest.fixture
def engine(worker_model_dir):
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig

    config = EngineConfig(
        model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
        cache=CacheConfig(num_kv_tokens=4096),
        device="cpu",
    )
    return LLMEngine(config)


def test_plain_redis_client_gets_its_result(redis_server, prefix, worker_model_dir, engine, tmp_path):
    keys, client = Keys(prefix), redis_server.client()
    with ProcessWorker(make_settings(redis_server, prefix, worker_model_dir), tmp_path / "worker.log") as worker:
        consumer = worker.wait_ready(client, keys)
        out = subprocess.run(
            [sys.executable, "-I", "-c", PLAIN_CLIENT, redis_server.url, prefix, "plain-1"],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )
        assert worker.terminate() == 0, worker.log_text()[-3000:]
    result = json.loads(out.stdout)
    stream = result["stream"]
    assert [e["type"] for e in stream] == ["token"] * 6 + ["done"]
    assert [int(e["seq"]) for e in stream] == list(range(1, 8))
    tokens = [t for e in stream[:-1] for t in json.loads(e["token_ids"])]
    expected = offline_outputs(
        engine, {"ref": (engine.encode("Once upon a time"), {"temperature": 0, "max_tokens": 6})}
    )
    assert tokens == expected["ref"][0]
    assert json.loads(stream[-1]["usage"]) == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    assert stream[-1]["finish_reason"] == "length" and stream[-1]["worker"] == consumer
    # The live channel carried the same events, seq as ints.
    assert [e["seq"] for e in result["published"]] == list(range(1, 8))
    assert "".join(e.get("text", "") for e in result["published"]) == "".join(e.get("text", "") for e in stream)
    # SIGTERM: a clean exit, its heartbeat gone, nothing left pending.
    assert client.get(keys.worker(consumer)) is None
    assert client.xpending(keys.requests, keys.group)["pending"] == 0


def _requests(engine, count: int, max_tokens: int) -> dict[str, tuple[list[int], dict]]:
    requests = {}
    for i in range(count):
        params = {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}
        if i % 4 == 1:
            params = {"temperature": 0.8, "seed": 50 + i, "max_tokens": max_tokens, "ignore_eos": True}
        if i == 2:  # each choice resumes from its own tokens
            params = {"temperature": 0.8, "seed": 9, "n": 2, "max_tokens": max_tokens, "ignore_eos": True}
        requests[f"job-{i}"] = (engine.encode(f"Job {i} says"), params)
    return requests


def _n(requests, request_id: str) -> int:
    return requests[request_id][1].get("n", 1)


def _wait_all(client, keys, requests, timeout_s: float) -> dict:
    return {rid: wait_complete(client, keys, [rid], n=_n(requests, rid), timeout_s=timeout_s)[rid] for rid in requests}


def _submit_all(client, keys, requests) -> None:
    for request_id, (prompt_ids, params) in requests.items():
        submit(client, keys, request_id, prompt_token_ids=prompt_ids, params=params)


def _wait_events(client, keys, request_ids, at_least: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(len(read_events(client, keys, rid)) >= at_least for rid in request_ids):
        assert time.monotonic() < deadline, "requests did not start"
        time.sleep(0.02)


def test_kill_9_mid_generation_loses_nothing(redis_server, prefix, worker_model_dir, engine, tmp_path):
    keys, client = Keys(prefix), redis_server.client()
    requests = _requests(engine, 16, max_tokens=80)
    settings = make_settings(redis_server, prefix, worker_model_dir, lease_ms=1500)
    with ProcessWorker(settings, tmp_path / "victim.log") as victim:
        victim_name = victim.wait_ready(client, keys)
        _submit_all(client, keys, requests)
        _wait_events(client, keys, list(requests), at_least=1)  # the victim holds all 16
        with ThreadWorker(settings, engine=engine) as survivor:
            _wait_events(client, keys, list(requests), at_least=4)
            victim.kill()
            written_by_victim = {rid: len(read_events(client, keys, rid)) for rid in requests}
            for request_id, written in written_by_victim.items():
                assert written < 81 * _n(requests, request_id), f"{request_id} finished before the kill"
            results = _wait_all(client, keys, requests, timeout_s=90)
            survivor_name = survivor.worker.consumer
    engine_free = engine.stats()
    assert engine_free.num_running == 0 and engine_free.num_waiting == 0
    expected = offline_outputs(engine, requests)
    for request_id in requests:
        events = assert_exactly_once(client, keys, request_id, n=_n(requests, request_id))
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
        writers = [e.worker for e in events]
        split = written_by_victim[request_id]
        assert set(writers[:split]) == {victim_name} and set(writers[split:]) <= {victim_name, survivor_name}
        assert writers[-1] == survivor_name
    assert client.xpending(keys.requests, keys.group)["pending"] == 0


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_two_healthy_workers_run_each_request_exactly_once(redis_server, prefix, worker_model_dir, engine, tmp_path):
    keys, client = Keys(prefix), redis_server.client()
    # Three waves of requests (4 a worker at once): 8 requests of 160 tokens took 1.7 s on a fast CI
    # machine, under the two lease periods this test needs to mean anything.
    requests = _requests(engine, 24, max_tokens=160)
    # Short leases, frequent claim passes, generations lasting many lease periods: a lease that
    # lapsed would show up as a claim by the other worker.
    ports = [free_port(), free_port()]
    workers = [
        ProcessWorker(
            make_settings(
                redis_server, prefix, worker_model_dir, lease_ms=900, claim_interval_ms=100, max_num_seqs=4,
                metrics_port=port,
            ),
            tmp_path / f"worker-{i}.log",
        )
        for i, port in enumerate(ports)
    ]  # fmt: skip
    try:
        names = [w.wait_ready(client, keys) for w in workers]
        started = time.monotonic()
        _submit_all(client, keys, requests)
        _wait_all(client, keys, requests, timeout_s=120)
        elapsed = time.monotonic() - started
        metrics = [_scrape(port) for port in ports]
        codes = [w.terminate() for w in workers]
    finally:
        for w in workers:
            w.__exit__(None, None, None)
    assert codes == [0, 0]
    assert elapsed > 2 * 0.9, f"generations ({elapsed:.1f}s) must outlast several leases"
    per_worker = {name: 0 for name in names}
    for request_id in requests:
        events = assert_exactly_once(client, keys, request_id, n=_n(requests, request_id))
        (writer,) = {e.worker for e in events}  # one worker wrote the whole stream
        per_worker[writer] += 1
    assert all(count > 0 for count in per_worker.values()), per_worker
    for values in metrics:
        assert values.get("inferq_worker_duplicate_events_total", 0) == 0
        assert values.get("inferq_worker_requests_lost_total", 0) == 0
        assert values["inferq_worker_lease_renewals_total"] >= 2 * 4  # held messages outlived their leases
    assert sum(v["inferq_worker_requests_admitted_total"] for v in metrics) == len(requests)


def test_sigterm_hands_unfinished_requests_to_a_live_worker(redis_server, prefix, worker_model_dir, engine, tmp_path):
    keys, client = Keys(prefix), redis_server.client()
    requests = _requests(engine, 6, max_tokens=120)
    # Leases far longer than the test: only the hand-off can explain a fast takeover.
    settings = make_settings(redis_server, prefix, worker_model_dir, lease_ms=60_000, claim_interval_ms=100)
    leaving_settings = settings.model_copy(update={"shutdown_grace_s": 0.0})
    with ProcessWorker(leaving_settings, tmp_path / "leaving.log") as leaving:
        leaving.wait_ready(client, keys)
        _submit_all(client, keys, requests)
        _wait_events(client, keys, list(requests), at_least=2)
        with ThreadWorker(settings, engine=engine) as staying:
            assert leaving.terminate() == 0, leaving.log_text()[-3000:]
            handed_off_at = time.monotonic()
            results = _wait_all(client, keys, requests, timeout_s=60)
            assert time.monotonic() - handed_off_at < 50
            registry = staying.worker.metrics.registry
            assert registry.get_sample_value("inferq_worker_requests_admitted_total") == len(requests)
    expected = offline_outputs(engine, requests)
    for request_id in requests:
        assert_exactly_once(client, keys, request_id, n=_n(requests, request_id))
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
        # a hand-off is no cancel: nothing the leaving worker did may reach a client as "abort"
        assert {e.finish_reason for e in results[request_id] if e.type == "done"} == {"length"}, request_id
