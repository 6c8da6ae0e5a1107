"""A real worker in a thread of the test process, a real private Redis, the tiny Llama on CPU.

Covers: parity with the offline engine under concurrency, dead letters (malformed, engine-refused,
poison), deadlines, cancellation freeing KV blocks within two steps, and the batch window.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.worker.harness import (
    ThreadWorker,
    assert_exactly_once,
    make_settings,
    offline_outputs,
    read_events,
    request_cancel,
    submit,
    tokens_by_index,
    wait_complete,
)
from worker.loop import Worker
from worker.protocol import Keys, WorkerHeartbeat

pytestmark = pytest.mark.timeout(120)


both_schedulings = pytest.mark.parametrize("engine", [False, True], ids=["sync", "async"], indirect=True)


@both_schedulings
def test_32_concurrent_requests_match_the_offline_engine(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    requests = {}
    for i in range(32):
        prompt_ids = engine.encode(f"Request number {i}: " + "tell me a story " * (i % 5))
        params = {"temperature": 0, "max_tokens": 6 + i % 7}
        if i % 8 == 3:  # seeded sampling continues identically too
            params = {"temperature": 0.9, "top_p": 0.95, "seed": 1000 + i, "max_tokens": 8}
        if i == 5:
            params = {"temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 5}
        requests[f"req-{i}"] = (prompt_ids, params)
    expected = offline_outputs(engine, requests)

    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        pipe = client.pipeline(transaction=False)
        for request_id, (prompt_ids, params) in requests.items():
            fields = {"v": "1", "id": request_id, "params": json.dumps(params)}
            if int(request_id.split("-")[1]) % 2:
                fields["prompt_token_ids"] = json.dumps(prompt_ids)
            else:  # tokenized by the worker
                fields["prompt"] = engine.tokenizer.decode(prompt_ids, skip_special_tokens=True)
            pipe.xadd(keys.requests, fields)
        pipe.execute()
        results = {rid: wait_complete(client, keys, [rid], n=p.get("n", 1))[rid] for rid, (_, p) in requests.items()}

    for request_id, (_, params) in requests.items():
        assert_exactly_once(client, keys, request_id, n=params.get("n", 1))
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
        for done in (e for e in results[request_id] if e.type == "done"):
            assert done.usage["completion_tokens"] == len(expected[request_id][done.index])
    assert client.xpending(keys.requests, keys.group)["pending"] == 0


def test_bad_messages_are_dead_lettered_and_the_worker_keeps_serving(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    good = {"temperature": 0, "max_tokens": 3}
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        submit(client, keys, "good-1", prompt="Hello", params=good)
        client.xadd(keys.requests, {"id": "no-version", "prompt": "x"})
        client.xadd(keys.requests, {"v": "1", "id": "bad id!", "prompt": "x"})
        client.xadd(keys.requests, {"v": "1", "id": "bad-json", "prompt": "x", "params": "{not json"})
        client.xadd(keys.requests, {"v": "1", "id": "not-utf8", "prompt": b"\xff\xfe"})
        submit(client, keys, "out-of-vocab", prompt_token_ids=[1, 999_999])
        submit(client, keys, "too-long", prompt_token_ids=[5] * 300)
        submit(client, keys, "bad-temperature", prompt="Hello", params={"temperature": -1})
        client.xadd(keys.requests, {"v": "1", "id": "foreign-stream", "prompt": "x", "result_stream": "elsewhere"})
        submit(client, keys, "good-2", prompt="World", params=good)
        submit(client, keys, "twice", prompt="Once", params={"max_tokens": 60, "ignore_eos": True})
        deadline = time.monotonic() + 30
        while not read_events(client, keys, "twice"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        submit(client, keys, "twice", prompt="Twice", params=good)  # a second message with a running id
        results = wait_complete(
            client,
            keys,
            [
                "good-1",
                "good-2",
                "no-version",
                "bad-json",
                "not-utf8",
                "out-of-vocab",
                "too-long",
                "bad-temperature",
                "foreign-stream",
                "twice",
            ],
        )

    for request_id in ("good-1", "good-2"):
        assert [e.type for e in results[request_id]] == ["token"] * 3 + ["done"]
    dead = {}
    for _, fields in client.xrange(keys.dead):
        dead[fields[b"id"].decode()] = fields
    assert set(dead) == {
        "no-version", "", "bad-json", "not-utf8", "out-of-vocab", "too-long", "bad-temperature", "foreign-stream",
        "twice",
    }  # fmt: skip
    assert "duplicate" in dead["twice"][b"reason"].decode()
    assert json.loads(dead["twice"][b"fields"])["prompt"] == "Twice"
    assert_exactly_once(client, keys, "twice")  # the first one's stream is untouched
    assert len(tokens_by_index(results["twice"])[0]) == 60
    reasons = {rid: fields[b"reason"].decode() for rid, fields in dead.items()}
    assert "v: must be '1'" in reasons["no-version"]
    assert "id: must match" in reasons[""]
    assert json.loads(dead[""][b"fields"])["id"] == "bad id!"
    assert "params: is not valid JSON" in reasons["bad-json"]
    assert "prompt: is not valid UTF-8" in reasons["not-utf8"]
    assert "outside the vocabulary" in reasons["out-of-vocab"]
    assert "max_model_len" in reasons["too-long"]
    assert "params.temperature: must be a number in [0, 2], got -1" in reasons["bad-temperature"]
    # A result stream other than the request's own is refused; the error goes to the request's own stream.
    assert f"result_stream: must be '{prefix}:result:foreign-stream' (the request's own)" in reasons["foreign-stream"]
    assert not client.exists("elsewhere")
    for request_id in (
        "no-version", "bad-json", "not-utf8", "out-of-vocab", "too-long", "bad-temperature", "foreign-stream"
    ):  # fmt: skip
        (event,) = results[request_id]
        assert event.type == "error" and event.error == reasons[request_id]
    assert client.xpending(keys.requests, keys.group)["pending"] == 0


def test_poison_message_is_dead_lettered_after_max_deliveries(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    client.xgroup_create(keys.requests, keys.group, id="0", mkstream=True)
    message_id = submit(client, keys, "poison", prompt="Hello")
    # A worker that crashes on this message, three times: delivered, then claimed twice more.
    client.xreadgroup(keys.group, "crashed-1", {keys.requests: ">"})
    for name in ("crashed-2", "crashed-3"):
        client.xclaim(keys.requests, keys.group, name, 0, [message_id], idle=10**7)
    settings = make_settings(redis_server, prefix, worker_model_dir, max_deliveries=3)
    with ThreadWorker(settings, engine=engine):
        (event,) = wait_complete(client, keys, ["poison"])["poison"]
    assert event.type == "error" and "poison: delivered 4 times (max_deliveries is 3)" in event.error
    ((_, letter),) = client.xrange(keys.dead)
    assert letter[b"message_id"].decode() == message_id
    assert client.xpending(keys.requests, keys.group)["pending"] == 0


def test_deadline_passed_before_start_gives_an_error_event(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        submit(client, keys, "late", prompt="Hello", deadline=time.time() - 1)
        submit(client, keys, "in-time", prompt="Hello", deadline=time.time() + 60, params={"max_tokens": 2})
        results = wait_complete(client, keys, ["late", "in-time"])
    (event,) = results["late"]
    assert event.type == "error" and "deadline passed" in event.error
    assert results["in-time"][-1].type == "done"
    assert client.xlen(keys.dead) == 0


@both_schedulings
def test_cancel_frees_kv_blocks_within_two_steps(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    long_prompt = [100 + i for i in range(120)]  # 8 blocks of 16
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine) as tw:
        total = engine.stats().num_free_kv_tokens
        # A background request keeps the engine stepping after the cancelled one is gone.
        submit(client, keys, "background", prompt_token_ids=[7, 8, 9], params={"max_tokens": 200, "ignore_eos": True})
        submit(client, keys, "victim", prompt_token_ids=long_prompt, params={"max_tokens": 120, "ignore_eos": True})
        deadline = time.monotonic() + 30
        while len(read_events(client, keys, "victim")) < 3:
            assert time.monotonic() < deadline, "victim never started"
            time.sleep(0.01)
        before = tw.worker.step_log[-1]
        request_cancel(client, keys, "victim")
        # NOTE: counted from the last step logged once the cancel is in Redis, not from `before`: this
        # thread may lose the CPU between reading `before` and the cancel for longer than a step or two
        # (a loaded CI box), and the guarantee is about the steps whose reads go out after the cancel.
        # Step after+1 may have sent its reads already; step after+2 starts after this read, so its
        # reads see the cancel, and it ends with the victim's blocks free.
        after = tw.worker.step_log[-1]
        events = wait_complete(client, keys, ["victim"])["victim"]
        log = [entry for entry in list(tw.worker.step_log) if entry.step > after.step]
        assert len(log) >= 3, "the engine stopped stepping"

    assert events[-1].type == "done" and events[-1].finish_reason == "abort"
    assert_exactly_once(client, keys, "victim")
    # Seen by the reads of step after+1 or after+2; never scheduled after that.
    assert [entry.step for entry in log[:2]] == [after.step + 1, after.step + 2]
    assert all("victim" not in entry.scheduled for entry in log[2:])
    # At `before` the victim held >= 8 blocks (120 prompt tokens + output); by step after+2 they
    # are free again, less what the background request grew by since `before` (the victim grew as fast).
    assert before.num_free_kv_tokens <= total - 9 * 16
    freed = log[1].num_free_kv_tokens - before.num_free_kv_tokens
    assert freed >= 7 * 16, freed


@both_schedulings
def test_busy_worker_sends_its_cancel_checks_ahead_of_the_steps(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine) as tw:
        worker = tw.worker
        own_checks, sends = [], []
        check, send = worker.cancels.check, worker.intake.replies.send
        worker.cancels.check = lambda *args: own_checks.append(worker.engine.last_step.step) or check(*args)
        worker.intake.replies.send = lambda commands: sends.append([c[0] for c in commands]) or send(commands)
        ids = [f"r{i}" for i in range(3)]
        for request_id in ids:
            submit(client, keys, request_id, prompt_token_ids=[5, 6, 7], params={"max_tokens": 40, "ignore_eos": True})
        wait_complete(client, keys, ids)
        time.sleep(0.2)
        steps = worker.engine.last_step.step
    assert steps >= 40
    assert sum("GET" in names for names in sends) >= 35  # one check per step, sent ahead of it
    # Round trips of their own only where a step launched nothing (the last read of an async run).
    assert len(own_checks) <= 3, own_checks


def test_no_step_read_outlives_its_step(redis_server, prefix, worker_model_dir, engine):
    """A step sends its reads before the engine runs it and reads their replies after its outputs, so no reply is
    left in the loop's socket between iterations (where the next intake would miss what it delivered): a message
    that arrives while the engine works is admitted through the step reads and served."""
    keys, client = Keys(prefix), redis_server.client()
    worker = Worker(make_settings(redis_server, prefix, worker_model_dir), engine=engine)
    worker.publisher.start()
    try:
        worker.intake.reader.ensure_group()
        submit(client, keys, "first", prompt_token_ids=[5, 6, 7], params={"max_tokens": 12, "ignore_eos": True})
        sends, send = [], worker.intake.replies.send
        worker.intake.replies.send = lambda commands: sends.append([c[0] for c in commands]) or send(commands)
        submitted = False
        for _ in range(200):
            if worker.engine.has_unfinished_requests() and not submitted:  # arrives while the engine works
                submit(client, keys, "second", prompt_token_ids=[8, 9], params={"max_tokens": 3})
                submitted = True
            worker._iteration()
            assert not worker.intake.replies.pending  # every step read back what it sent
            if submitted and not worker.jobs:
                break
        assert any("XREADGROUP" in names for names in sends)  # the second request came in through a step's read
        assert worker.publisher.close(5)
    finally:
        worker.intake.replies.close()
        worker.client.close()
    assert read_events(client, keys, "second")[-1][1].type == "done"


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_arrivals_within_the_batch_window_prefill_in_one_step(redis_server, prefix, worker_model_dir, engine, busy):
    keys, client = Keys(prefix), redis_server.client()
    settings = make_settings(redis_server, prefix, worker_model_dir, batch_window_ms=400)
    with ThreadWorker(settings, engine=engine) as tw:
        if busy:  # decoding goes on while the window gathers arrivals
            submit(client, keys, "running", prompt_token_ids=[5, 6], params={"max_tokens": 150, "ignore_eos": True})
            wait_for = time.monotonic() + 30
            while len(read_events(client, keys, "running")) < 2:
                assert time.monotonic() < wait_for
                time.sleep(0.01)
        ids = [f"arrival-{i}" for i in range(4)]
        for request_id in ids:
            submit(client, keys, request_id, prompt=f"Story {request_id}", params={"max_tokens": 3})
            time.sleep(0.03)  # staggered arrivals, all well inside the 400 ms window
        wait_complete(client, keys, ids)
        starts = [set(entry.new_request_ids) & set(ids) for entry in tw.worker.step_log]
    assert set(ids) in starts, [s for s in starts if s]
    if busy:
        running_steps = [e for e in tw.worker.step_log if "running" in e.scheduled]
        assert len(running_steps) > 5  # it kept decoding while the window was open


def test_deadline_passing_while_queued_in_the_engine_drops_before_prefill(redis_server, prefix, worker_model_dir):
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SchedulerConfig

    one_at_a_time = LLMEngine(
        EngineConfig(
            model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
            cache=CacheConfig(num_kv_tokens=4096),
            scheduler=SchedulerConfig(max_num_seqs=1),
            device="cpu",
        )
    )
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=one_at_a_time) as tw:
        submit(client, keys, "hog", prompt_token_ids=[5, 6], params={"max_tokens": 240, "ignore_eos": True})
        deadline = time.monotonic() + 30
        while not read_events(client, keys, "hog"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        submit(client, keys, "queued", prompt="Hello", deadline=time.time() + 0.3)
        (event,) = wait_complete(client, keys, ["queued"])["queued"]
        assert "hog" in tw.worker.jobs, "the hog must still be running, so 'queued' waited in the engine"
        request_cancel(client, keys, "hog")
        wait_complete(client, keys, ["hog"])
        started = {rid for entry in tw.worker.step_log for rid in entry.new_request_ids}
    assert event.type == "error" and "deadline passed" in event.error and "before the request started" in event.error
    assert "queued" not in started


def test_missing_group_is_recreated_and_finished_requests_are_not_rerun(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        submit(client, keys, "before", prompt="Hello", params={"max_tokens": 3})
        first = wait_complete(client, keys, ["before"])["before"]
        client.xgroup_destroy(keys.requests, keys.group)  # as if Redis came back without it
        submit(client, keys, "after", prompt="World", params={"max_tokens": 3})
        wait_complete(client, keys, ["after"])
        deadline = time.monotonic() + 10
        while client.xpending(keys.requests, keys.group)["pending"]:  # "before" is re-read, then acknowledged
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert [e for _, e in read_events(client, keys, "before")] == first  # not run a second time
    assert_exactly_once(client, keys, "after")


def test_intake_stops_reading_while_the_kv_pool_is_full(redis_server, prefix, worker_model_dir):
    """Drives the loop by hand (white box): one iteration at a time, so 'did not read' is observable."""
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig

    small = LLMEngine(
        EngineConfig(
            model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
            cache=CacheConfig(num_kv_tokens=256),  # 16 blocks
            device="cpu",
        )
    )
    keys, client = Keys(prefix), redis_server.client()
    worker = Worker(make_settings(redis_server, prefix, worker_model_dir, num_kv_tokens=256), engine=small)
    worker._start()
    try:
        submit(client, keys, "big", prompt_token_ids=[9] * 241, params={"max_tokens": 15, "ignore_eos": True})
        for _ in range(100):
            worker._iteration()
            if "big" in worker.jobs and worker.jobs["big"].started:
                break
        assert small.stats().num_free_kv_tokens < 16, "the big request fills the pool"
        submit(client, keys, "small", prompt="Hi", params={"max_tokens": 2})
        for _ in range(3):
            worker._iteration()
            assert "small" not in worker.jobs and not len(worker.intake.window)
            (group,) = client.xinfo_groups(keys.requests)
            assert group["lag"] == 1, "no room: the message stays in the stream for other workers"
        worker.heartbeat.beat()
        beat = WorkerHeartbeat.from_json(client.get(keys.worker(worker.consumer)))
        assert beat.running == 1 and beat.free_kv_tokens == small.stats().num_free_kv_tokens
        assert beat.max_model_len == 256 and beat.consumer == worker.consumer
        assert beat.slots == worker.settings.max_num_seqs  # what a Batch API runner sums (batch/worker_slots.py)
        deadline = time.monotonic() + 30
        while not any(e.type == "done" for _, e in read_events(client, keys, "small")):
            assert time.monotonic() < deadline
            worker._iteration()
    finally:
        worker.request_stop(force=True)
        worker._shutdown()
    assert_exactly_once(client, keys, "big")
    assert_exactly_once(client, keys, "small")


def test_a_restarted_worker_with_a_stable_name_takes_its_own_pending_first(
    redis_server, prefix, worker_model_dir, engine
):
    keys, client = Keys(prefix), redis_server.client()
    client.xgroup_create(keys.requests, keys.group, id="0", mkstream=True)
    submit(client, keys, "mine", prompt="Hello", params={"max_tokens": 2})
    client.xreadgroup(keys.group, "pod-0", {keys.requests: ">"})  # the previous life of pod-0 read it, then died
    # A lease far longer than the test: only reading its own pending entries can explain a pickup.
    settings = make_settings(redis_server, prefix, worker_model_dir, consumer="pod-0", lease_ms=600_000)
    with ThreadWorker(settings, engine=engine):
        events = wait_complete(client, keys, ["mine"], timeout_s=30)["mine"]
    assert events[-1].type == "done" and {e.worker for e in events} == {"pod-0"}
    assert client.xpending(keys.requests, keys.group)["pending"] == 0
