"""Redis restarted (AOF on, kill -9) while requests are queued and running: the same worker,
never restarted, finishes every request whose XADD returned before the restart, exactly once."""

from __future__ import annotations

import threading
import time

import pytest

from tests.redis_server import RedisServer
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

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def private_redis():
    with RedisServer(appendonly=True) as server:
        yield server


def test_worker_rides_out_a_redis_restart(private_redis, prefix, worker_model_dir):
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig

    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
            cache=CacheConfig(num_kv_tokens=4096),
            device="cpu",
        )
    )
    keys, client = Keys(prefix), private_redis.client()
    requests = {
        f"r-{i}": (engine.encode(f"Restart test {i}"), {"temperature": 0, "max_tokens": 40, "ignore_eos": True})
        for i in range(8)
    }
    # Two at a time and no queue in the engine (decision 0062), so most requests are still queued in the stream
    # when Redis goes down.
    settings = make_settings(private_redis, prefix, worker_model_dir, max_num_seqs=2, max_queued_seqs=0)
    with ThreadWorker(settings, engine=engine) as tw:
        for request_id, (prompt_ids, params) in requests.items():
            submit(client, keys, request_id, prompt_token_ids=prompt_ids, params=params)  # XADD returned
        deadline = time.monotonic() + 30
        while len(read_events(client, keys, "r-0")) < 3:
            assert time.monotonic() < deadline, "the first request never started"
            time.sleep(0.01)
        (group,) = client.xinfo_groups(keys.requests)
        assert group["lag"] >= 4, "requests must still be queued at the restart"
        steps_before = len(tw.worker.step_log)
        registry = tw.worker.metrics.registry
        backlog, watching = [0.0], threading.Event()

        def watch_backlog() -> None:  # the publisher's unwritten batches, sampled through the outage
            while not watching.is_set():
                backlog[0] = max(backlog[0], registry.get_sample_value("inferq_worker_unwritten_event_batches"))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch_backlog, daemon=True)
        watcher.start()
        private_redis.restart(hard=True, down_s=1.0)

        results = {rid: wait_complete(client, keys, [rid], timeout_s=60)[rid] for rid in requests}
        watching.set()
        watcher.join()
        assert tw.thread.is_alive() and tw.worker.ready.is_set()
        assert registry.get_sample_value("inferq_worker_redis_errors_total") > 0, "the outage went unnoticed"
        assert backlog[0] > 0, "events waited for Redis: the backlog gauge must have shown them"
        assert tw.worker.publisher.flush(10.0)
        assert registry.get_sample_value("inferq_worker_unwritten_event_batches") == 0
        assert len(tw.worker.step_log) > steps_before
    expected = offline_outputs(engine, requests)
    for request_id in requests:
        assert_exactly_once(client, keys, request_id)
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
    assert client.xpending(keys.requests, keys.group)["pending"] == 0
