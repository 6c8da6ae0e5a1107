"""Admission control without a worker: the bounded queue (503 + Retry-After), each key's share of it and rate
limits (429)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest

from api.auth import key_owner
from tests.api.raw_http import completion_head, connect, read_response
from tests.api.wire import (
    MODEL,
    AutoResponder,
    assert_envelope,
    done,
    publish_model,
    queued_requests,
    stream_len,
    token,
    wait_for_request,
    write_event,
)

PROMPT = {"model": MODEL, "prompt": "Hi", "max_tokens": 8}


def start_of_a_fresh_minute() -> None:
    """Rate limits use fixed one-minute windows: start a rate test with 3+ s of its window left."""
    left = 60 - time.time() % 60
    if left < 3:
        time.sleep(left + 0.05)


def test_queue_cap_sheds_the_excess_with_503_and_admitted_requests_complete(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=2, overload_retry_after_s=3)

    def post(_: int) -> tuple[int, httpx.Response, float]:
        started = time.monotonic()
        with api.client(timeout=30) as client:
            response = client.post("/v1/completions", json=PROMPT)
        return response.status_code, response, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(post, i) for i in range(6)]
        # Nothing is answered until two requests sit in the queue: the other four must be refused.
        admitted = wait_for_request(rclient, prefix, count=2)
        time.sleep(0.3)
        refused = [f.result() for f in futures if f.done()]
        assert len(refused) == 4
        for _, response, elapsed in refused:
            error = assert_envelope(response, 503)
            assert error["code"] == "overloaded" and "2 requests are queued (limit 2)" in error["message"]
            assert response.headers["retry-after"] == "3"
            assert elapsed < 2.0  # shed quickly, not after a wait
        assert stream_len(rclient, prefix) == 2
        # Now a "worker" answers the admitted two: both complete.
        for message in admitted:
            write_event(rclient, prefix, message.id, token(1, "fine"))
            write_event(rclient, prefix, message.id, done(2))
        results = [f.result() for f in futures]
    completed = [r for status, r, _ in results if status == 200]
    assert len(completed) == 2
    assert {r.json()["id"] for r in completed} == {m.id for m in admitted}


def test_a_started_request_leaves_the_queue(start_api, rclient, prefix):
    """The cap counts requests no worker has started: once one streams, a new one fits."""
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=1)
    with api.client(timeout=30) as client, ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(client.post, "/v1/completions", json={**PROMPT, "stream": True})
        rid = wait_for_request(rclient, prefix)[0].id
        assert_envelope(client.post("/v1/completions", json=PROMPT), 503)
        write_event(rclient, prefix, rid, token(1, "started"))
        deadline = time.monotonic() + 5
        while rclient.zcard(f"{prefix}:api:queue") and time.monotonic() < deadline:
            time.sleep(0.02)
        with AutoResponder(rclient, prefix):
            assert client.post("/v1/completions", json=PROMPT).status_code == 200
        write_event(rclient, prefix, rid, done(2))
        assert first.result().status_code == 200


def test_queued_prompt_tokens_are_capped(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(max_queued_prompt_tokens=50)
    with api.client(timeout=30) as client, ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(client.post, "/v1/completions", json={**PROMPT, "prompt": "a" * 30, "stream": True})
        wait_for_request(rclient, prefix)
        response = client.post("/v1/completions", json={**PROMPT, "prompt": "b" * 30})
        error = assert_envelope(response, 503)
        assert "30 prompt tokens are queued (limit 50)" in error["message"]
        assert stream_len(rclient, prefix) == 1
        rid = wait_for_request(rclient, prefix)[0].id
        write_event(rclient, prefix, rid, done(1))


def test_requests_per_minute_per_key(start_api, rclient, prefix):
    start_of_a_fresh_minute()
    publish_model(rclient, prefix)
    api = start_api(rate_limit_rpm=2, api_keys=["key-a", "key-b"])
    with AutoResponder(rclient, prefix), api.client(api_key="key-a") as a, api.client(api_key="key-b") as b:
        assert a.post("/v1/completions", json=PROMPT).status_code == 200
        assert a.post("/v1/completions", json=PROMPT).status_code == 200
        response = a.post("/v1/completions", json=PROMPT)
        error = assert_envelope(response, 429)
        assert error["code"] == "rate_limit_exceeded" and "2 requests used of 2 per minute" in error["message"]
        assert 1 <= int(response.headers["retry-after"]) <= 60
        assert stream_len(rclient, prefix) == 2
        assert b.post("/v1/completions", json=PROMPT).status_code == 200  # another key, its own budget


def test_tokens_per_minute(start_api, rclient, prefix):
    start_of_a_fresh_minute()
    publish_model(rclient, prefix)
    api = start_api(rate_limit_tpm=25)  # each request reserves 2 prompt + 8 max_tokens = 10
    with AutoResponder(rclient, prefix), api.client() as client:
        assert client.post("/v1/completions", json=PROMPT).status_code == 200
        assert client.post("/v1/completions", json=PROMPT).status_code == 200
        error = assert_envelope(client.post("/v1/completions", json=PROMPT), 429)
        assert "20 tokens used of 25 per minute" in error["message"]
        too_big = assert_envelope(client.post("/v1/completions", json={**PROMPT, "max_tokens": 30}), 429)
        assert "needs 32 tokens" in too_big["message"]
        assert stream_len(rclient, prefix) == 2


def test_rate_limits_hold_across_replicas(start_api, rclient, prefix):
    start_of_a_fresh_minute()
    publish_model(rclient, prefix)
    first, second = start_api(rate_limit_rpm=1), start_api(rate_limit_rpm=1)
    with AutoResponder(rclient, prefix), first.client() as one, second.client() as two:
        assert one.post("/v1/completions", json=PROMPT).status_code == 200
        assert_envelope(two.post("/v1/completions", json=PROMPT), 429)


def test_a_full_queue_refuses_a_completion_before_reading_its_body(start_api, rclient, prefix):
    """The 503 of a full queue comes from the headers alone (api/admission_gate.py): a request whose body never
    arrives is refused at once, so nothing of it was parsed, validated or tokenized."""
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=1, body_timeout_s=30)
    with api.client(timeout=30) as client, client.stream("POST", "/v1/completions", json={**PROMPT, "stream": True}):
        queued = wait_for_request(rclient, prefix)[0].id
        with connect(api.port) as headers_only:
            started = time.monotonic()
            headers_only.sendall(completion_head(api.port, "content-length: 1000"))
            refused = read_response(headers_only, timeout_s=5)
            assert time.monotonic() - started < 2.0
        error = assert_envelope(refused, 503)
        assert error["code"] == "overloaded" and "1 requests are queued (limit 1)" in error["message"]
        assert refused.headers["retry-after"] == "1"
        # A retry with an Idempotency-Key may attach to its earlier request, full queue or not: it passes the gate,
        # the route reads its body, and the admission script refuses the new request.
        body = json.dumps(PROMPT).encode()
        with connect(api.port) as keyed:
            keyed.sendall(completion_head(api.port, f"content-length: {len(body)}", extra="idempotency-key: k1\r\n"))
            keyed.settimeout(0.5)
            with pytest.raises(TimeoutError):
                keyed.recv(1)  # waiting for the body
            keyed.sendall(body)
            assert_envelope(read_response(keyed, timeout_s=5), 503)
        assert stream_len(rclient, prefix) == 1
        write_event(rclient, prefix, queued, done(1))


def test_requests_on_their_way_to_the_script_count_before_a_body_is_parsed(start_api, rclient, prefix):
    """A burst reaches an empty queue together: the requests already on their way to the admission script count,
    so the next one is refused with 503 before its body is parsed (here a body that is not even JSON, which
    parsed would be a 400). Redis pauses writes, so that two requests wait at the script."""
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=2)
    not_json = {"content": b"{not json", "headers": {"content-type": "application/json"}}
    with api.client(timeout=30) as client, ThreadPoolExecutor(max_workers=2) as pool:
        rclient.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        try:
            on_their_way = [pool.submit(client.post, "/v1/completions", json=PROMPT) for _ in range(2)]
            # Each subscribes to its events (a read, not paused) right before the script (a write, paused).
            deadline = time.monotonic() + 4
            while len(rclient.pubsub_channels(f"{prefix}:events:cmpl-*")) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(rclient.pubsub_channels(f"{prefix}:events:cmpl-*")) == 2
            response = client.post("/v1/completions", **not_json)
        finally:
            rclient.execute_command("CLIENT", "UNPAUSE")
        error = assert_envelope(response, 503)
        assert error["code"] == "overloaded" and "2 requests are queued (limit 2)" in error["message"]
        for message in wait_for_request(rclient, prefix, count=2):
            write_event(rclient, prefix, message.id, done(1))
        assert [future.result().status_code for future in on_their_way] == [200, 200]
        assert api.server.config.app.state.inferq.intake.count == 0 and stream_len(rclient, prefix) == 2
        # With a place free, the same body is parsed: 400.
        assert assert_envelope(client.post("/v1/completions", **not_json), 400)["code"] == "invalid_json"


def test_a_stale_queue_does_not_keep_the_gate_shut(start_api, rclient, prefix):
    """Entries of a replica that died (older than the queue timeout) do not count: the gate lets a request
    through to the admission script, which drops them and admits it."""
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=2, queue_timeout_s=1)
    old = time.time() - 60
    rclient.zadd(f"{prefix}:api:queue", {"cmpl-dead-1": old, "cmpl-dead-2": old})
    rclient.hset(f"{prefix}:api:queue:tokens", mapping={"cmpl-dead-1": 5, "cmpl-dead-2": 5})
    with AutoResponder(rclient, prefix), api.client() as client:
        assert client.post("/v1/completions", json=PROMPT).status_code == 200
    assert rclient.zcard(f"{prefix}:api:queue") == 0


def test_one_key_holds_at_most_its_share_of_the_queue_across_replicas(start_api, rclient, prefix):
    """Key A's burst fills its share (half the queue) and no more: the rest of A's requests get 429, and key B is
    still admitted; two replicas agree, since the share is counted in the admission script."""
    publish_model(rclient, prefix)
    settings = {"api_keys": ["key-a", "key-b"], "max_queued_requests": 4, "max_queued_per_key_fraction": 0.5}
    first, second = start_api(**settings), start_api(**settings)
    streaming = {**PROMPT, "stream": True}
    with ExitStack() as held:
        a = [held.enter_context(api.client(api_key="key-a", timeout=30)) for api in (first, second)]
        b = held.enter_context(second.client(api_key="key-b", timeout=30))
        answers = [held.enter_context(a[i % 2].stream("POST", "/v1/completions", json=streaming)) for i in range(4)]
        assert [r.status_code for r in answers] == [200, 200, 429, 429]
        for refused in answers[2:]:
            refused.read()
            error = assert_envelope(refused, 429)
            assert error["code"] == "queue_share_exceeded" and "has 2 requests queued" in error["message"]
            assert "(2 of 4, INFERQ_MAX_QUEUED_PER_KEY_FRACTION)" in error["message"]
            assert refused.headers["retry-after"] == "1"
        assert held.enter_context(b.stream("POST", "/v1/completions", json=streaming)).status_code == 200
        assert stream_len(rclient, prefix) == 3
        # One of A's requests starts (its first event): A may queue another.
        started = answers[0].headers["x-request-id"]
        write_event(rclient, prefix, started, token(1, "go"))
        deadline = time.monotonic() + 5
        while rclient.zscore(f"{prefix}:api:queue", started) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.enter_context(a[1].stream("POST", "/v1/completions", json=streaming)).status_code == 200
        for message in queued_requests(rclient, prefix):
            write_event(rclient, prefix, message.id, done(2 if message.id == started else 1))


def test_an_owner_entry_left_behind_does_not_count_against_its_key(start_api, rclient, prefix):
    """A release by a replica that predates owner entries leaves the entry without its queue entry: the admission
    script drops it rather than count it."""
    publish_model(rclient, prefix)
    api = start_api(api_keys=["key-a", "key-b"], max_queued_requests=4)
    owners = f"{prefix}:api:queue:owners"
    rclient.hset(owners, mapping={"cmpl-gone-1": key_owner("key-a"), "cmpl-gone-2": key_owner("key-a")})
    streaming = {**PROMPT, "stream": True}
    with ExitStack() as held:
        client = held.enter_context(api.client(api_key="key-a", timeout=30))
        answers = [held.enter_context(client.stream("POST", "/v1/completions", json=streaming)) for _ in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 429]
        assert set(rclient.hkeys(owners)) == {r.headers["x-request-id"] for r in answers[:2]}
        for response in answers[:2]:
            write_event(rclient, prefix, response.headers["x-request-id"], done(1))
