"""Admission control without a worker: the bounded queue (503 + Retry-After) and rate limits (429)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.wire import (
    MODEL,
    AutoResponder,
    assert_envelope,
    done,
    publish_model,
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
