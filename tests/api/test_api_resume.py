"""Resuming a stream with Last-Event-ID on another replica, cancel on disconnect, cancel by id.

The events are written into Redis in the wire format by the test (no worker), so the exact
seq numbers and timing are under the test's control.
"""

from __future__ import annotations

import json
import time

import httpx

from tests.api.wire import (
    MODEL,
    assert_envelope,
    chunks,
    done,
    parse_sse,
    publish_model,
    token,
    wait_for_request,
    write_event,
)
from worker.protocol import Keys

WORDS = ["Once", " upon", " a", " time", " there", " was"]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 10, "stream": True}


def read_events_until(response: httpx.Response, last_id: str) -> list[dict[str, str]]:
    """Read SSE events off a live response until the one with id `last_id`, then stop reading."""
    buffer, events = "", []
    for text in response.iter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            events += parse_sse(block + "\n\n")
            if events and events[-1].get("id") == last_id:
                return events
    raise AssertionError(f"the stream ended before event {last_id}")


def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def content(chunk_list: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunk_list if c.get("choices"))


def test_cut_connection_resumes_on_another_replica_with_last_event_id(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    first, second = start_api(resume_grace_s=2.0), start_api()
    with first.client() as client, client.stream("POST", "/v1/chat/completions", json=BODY) as response:
        request_id = response.headers["x-request-id"]
        for seq, word in enumerate(WORDS[:3], start=1):
            write_event(rclient, prefix, request_id, token(seq, word))
        before = read_events_until(response, "3")
    # The connection is cut. The worker goes on meanwhile.
    for seq, word in enumerate(WORDS[3:], start=4):
        write_event(rclient, prefix, request_id, token(seq, word))
    with (
        second.client() as client,
        client.stream("GET", f"/v1/requests/{request_id}/stream", headers={"Last-Event-ID": "3"}) as response,
    ):
        assert response.status_code == 200
        write_event(rclient, prefix, request_id, done(7, "length"))
        after = parse_sse(response.read().decode())
    ids = [e["id"] for e in before + after if "id" in e]
    assert ids == [str(i) for i in range(1, 8)]  # none repeated, none missing
    assert after[-1]["data"] == "[DONE]"
    assert content(chunks(before) + chunks(after)) == "".join(WORDS)
    assert chunks(after)[-1]["choices"][0]["finish_reason"] == "length"
    assert "role" not in chunks(after)[0]["choices"][0]["delta"]  # the role went out with event 1
    time.sleep(2.3)  # past the first replica's grace period: it must not cancel a finished request
    assert rclient.get(Keys(prefix).cancel(request_id)) is None


def test_resume_with_query_parameter_and_after_the_end(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    with api.client() as client, client.stream("POST", "/v1/completions", json={**BODY, "prompt": "p"}) as response:
        request_id = response.headers["x-request-id"]
        for seq, word in enumerate(WORDS, start=1):
            write_event(rclient, prefix, request_id, token(seq, word))
        write_event(rclient, prefix, request_id, done(7))
        whole = parse_sse(response.read().decode())
    with api.client() as client:
        tail = parse_sse(client.get(f"/v1/requests/{request_id}/stream?last_event_id=4").text)
        assert [e.get("id") for e in tail] == ["5", "6", "7", None]
        assert [c["choices"][0]["text"] for c in chunks(tail)] == WORDS[4:] + [""]
        everything = parse_sse(client.get(f"/v1/requests/{request_id}/stream").text)
        assert everything == whole
        # After the last event only the trailer is left.
        assert parse_sse(client.get(f"/v1/requests/{request_id}/stream", headers={"Last-Event-ID": "7"}).text) == [
            {"data": "[DONE]"}
        ]
        assert_envelope(client.get(f"/v1/requests/{request_id}/stream", headers={"Last-Event-ID": "x"}), 400)


def test_resume_keeps_usage_and_role_right_for_late_choices(start_api, rclient, prefix):
    """n=2, choice 1 starts after the resume point: its first chunk still carries the role."""
    publish_model(rclient, prefix)
    api = start_api()
    body = {**BODY, "n": 2, "stream_options": {"include_usage": True}}
    with api.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        request_id = response.headers["x-request-id"]
        write_event(rclient, prefix, request_id, token(1, "A", index=0))
        read_events_until(response, "1")
    events = [
        token(2, "B", index=1),
        done(3, index=0, prompt=3, completion=1),
        done(4, index=1, prompt=3, completion=1),
    ]
    for event in events:
        write_event(rclient, prefix, request_id, event)
    with api.client() as client:
        tail = chunks(parse_sse(client.get(f"/v1/requests/{request_id}/stream?last_event_id=1").text))
    assert tail[0]["choices"][0] == {
        "index": 1,
        "delta": {"role": "assistant", "content": "B"},
        "logprobs": None,
        "finish_reason": None,
    }
    assert tail[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_disconnected_client_is_cancelled_after_the_grace_period(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(resume_grace_s=0.5)
    with api.client() as client, client.stream("POST", "/v1/chat/completions", json=BODY) as response:
        request_id = response.headers["x-request-id"]
        write_event(rclient, prefix, request_id, token(1, "Hi"))
        read_events_until(response, "1")
        left_at = time.monotonic()
    cancel_key = Keys(prefix).cancel(request_id)
    wait_until(lambda: rclient.get(cancel_key) == "1")
    assert time.monotonic() - left_at >= 0.45  # not before the grace period
    assert rclient.ttl(cancel_key) > 0


def test_reattaching_within_the_grace_period_prevents_the_cancel(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    first, second = start_api(resume_grace_s=0.5), start_api(resume_grace_s=0.5)
    with first.client() as client, client.stream("POST", "/v1/chat/completions", json=BODY) as response:
        request_id = response.headers["x-request-id"]
        write_event(rclient, prefix, request_id, token(1, "Hi"))
        read_events_until(response, "1")
    with (
        second.client() as client,
        client.stream("GET", f"/v1/requests/{request_id}/stream", headers={"Last-Event-ID": "1"}) as response,
    ):
        time.sleep(1.0)  # well past the first replica's grace period, still attached here
        assert rclient.get(Keys(prefix).cancel(request_id)) is None
        write_event(rclient, prefix, request_id, token(2, " there"))
        write_event(rclient, prefix, request_id, done(3))
        assert content(chunks(parse_sse(response.read().decode()))) == " there"
    time.sleep(0.7)
    assert rclient.get(Keys(prefix).cancel(request_id)) is None


def test_non_streamed_client_that_hangs_up_is_cancelled(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    with api.client(timeout=0.5) as client:
        try:
            client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("nothing answered the request: the call must time out")
    request_id = wait_for_request(rclient, prefix)[0].id
    wait_until(lambda: rclient.get(Keys(prefix).cancel(request_id)) == "1")


def test_resume_and_cancel_check_the_owner(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(api_keys=["owner-key", "other-key"])
    with api.client(api_key="owner-key") as owner, owner.stream("POST", "/v1/chat/completions", json=BODY) as resp:
        request_id = resp.headers["x-request-id"]
        with api.client(api_key="other-key") as other:
            for method, url in [
                ("GET", f"/v1/requests/{request_id}/stream"),
                ("POST", f"/v1/requests/{request_id}/cancel"),
            ]:
                error = assert_envelope(other.request(method, url), 404)
                assert error["code"] == "request_not_found"
        assert rclient.get(Keys(prefix).cancel(request_id)) is None
        with api.client(api_key="owner-key") as again:
            assert again.post(f"/v1/requests/{request_id}/cancel").json() == {
                "id": request_id,
                "object": "request.cancel",
                "cancelled": True,
            }
        assert rclient.get(Keys(prefix).cancel(request_id)) == "1"
        write_event(rclient, prefix, request_id, done(1, "abort"))
        last = chunks(parse_sse(resp.read().decode()))[-1]
        assert last["error"]["code"] == "request_cancelled"  # a client never sees finish_reason "abort"
    with api.client(api_key="owner-key") as owner:
        assert owner.post(f"/v1/requests/{request_id}/cancel").json()["cancelled"] is False
        assert_envelope(owner.get("/v1/requests/no-such-request/stream"), 404)


def test_every_response_names_its_request(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    with api.client() as client, client.stream("POST", "/v1/chat/completions", json=BODY) as response:
        request_id = response.headers["x-request-id"]
        write_event(rclient, prefix, request_id, token(1, "x"))
        write_event(rclient, prefix, request_id, done(2))
        body = response.read().decode()
    assert all(json.loads(e["data"])["id"] == request_id for e in parse_sse(body) if e["data"] != "[DONE]")
