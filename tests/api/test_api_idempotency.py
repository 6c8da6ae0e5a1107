"""Idempotency-Key: a retry gets the first request's answer, never a second generation."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tests.api.wire import (
    MODEL,
    AutoResponder,
    assert_envelope,
    chunks,
    done,
    parse_sse,
    publish_model,
    stream_len,
    token,
    wait_for_request,
    write_event,
)

BODY = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0.0}


def test_same_key_same_body_returns_the_same_request(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    with AutoResponder(rclient, prefix), api.client(headers={"Idempotency-Key": "order-42"}) as client:
        first = client.post("/v1/completions", json=BODY)
        # Key order and whitespace differ; the request is the same.
        retry = client.post(
            "/v1/completions", content=b'{"temperature": 0.0, "max_tokens": 4, "prompt": "Hello", "model": "%s"}'
            % MODEL.encode(), headers={"Content-Type": "application/json"},
        )  # fmt: skip
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json()
    assert retry.headers["x-request-id"] == first.headers["x-request-id"]
    assert stream_len(rclient, prefix) == 1


def test_same_key_other_body_is_rejected(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    with AutoResponder(rclient, prefix), api.client(headers={"Idempotency-Key": "k1"}) as client:
        assert client.post("/v1/completions", json=BODY).status_code == 200
        error = assert_envelope(client.post("/v1/completions", json={**BODY, "prompt": "Bye"}), 422)
        assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
        # The same key on the other endpoint is another body too.
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}
        assert_envelope(client.post("/v1/chat/completions", json=chat), 422)
    assert stream_len(rclient, prefix) == 1


def test_keys_are_scoped_to_the_caller(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(api_keys=["key-a", "key-b"])
    headers = {"Idempotency-Key": "shared"}
    a, b = api.client(api_key="key-a", headers=headers), api.client(api_key="key-b", headers=headers)
    with AutoResponder(rclient, prefix), a, b:
        assert a.post("/v1/completions", json=BODY).json()["id"] != b.post("/v1/completions", json=BODY).json()["id"]
    assert stream_len(rclient, prefix) == 2


def test_streamed_retry_replays_the_first_stream(start_api, rclient, prefix):
    """The retry of a streamed request (a client that lost the connection and did not know the
    id) gets the whole stream from the start, from another replica, without a second generation."""
    publish_model(rclient, prefix)
    first_api, second_api = start_api(), start_api()
    body = {**BODY, "stream": True}
    headers = {"Idempotency-Key": "stream-1"}
    with first_api.client(headers=headers) as client, client.stream("POST", "/v1/completions", json=body) as response:
        request_id = response.headers["x-request-id"]
        write_event(rclient, prefix, request_id, token(1, "Hi"))
        write_event(rclient, prefix, request_id, token(2, " you"))
        write_event(rclient, prefix, request_id, done(3))
        original = parse_sse(response.read().decode())
    with second_api.client(headers=headers) as client:
        retry = client.post("/v1/completions", json=body)
    assert retry.headers["x-request-id"] == request_id
    assert parse_sse(retry.text) == original
    assert "".join(c["choices"][0]["text"] for c in chunks(original)) == "Hi you"
    assert stream_len(rclient, prefix) == 1


def test_concurrent_retries_enqueue_once(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()

    def post(_: int):
        with api.client(headers={"Idempotency-Key": "burst"}, timeout=20) as client:
            return client.post("/v1/completions", json=BODY)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(post, i) for i in range(4)]
        message = wait_for_request(rclient, prefix)[0]
        time.sleep(0.3)  # every retry has arrived and attached by now
        write_event(rclient, prefix, message.id, token(1, "once"))
        write_event(rclient, prefix, message.id, done(2))
        responses = [f.result() for f in futures]
    assert {r.json()["id"] for r in responses} == {message.id}
    assert stream_len(rclient, prefix) == 1


def test_refused_request_does_not_burn_the_key(start_api, rclient, prefix):
    """A request refused before the queue (here: queue full) leaves the key free for the retry."""
    publish_model(rclient, prefix)
    api = start_api(max_queued_requests=0)
    with api.client(headers={"Idempotency-Key": "retry-me"}) as client:
        assert_envelope(client.post("/v1/completions", json=BODY), 503)
    assert stream_len(rclient, prefix) == 0
    assert not rclient.keys(f"{prefix}:api:idem:*")
