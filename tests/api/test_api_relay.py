"""The API's half of the wire contract, with events written into Redis the way a worker writes them.

No worker runs here: each test reads the request the API enqueued and answers it by hand
(result stream first, then pub/sub), so these are contract tests of the API side.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from api.settings import ApiSettings
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import (
    MODEL,
    chunks,
    done,
    parse_sse,
    publish_model,
    token,
    wait_for_request,
    write_event,
)
from tests.redis_server import RedisServer
from worker.protocol import Keys, ResultEvent

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


def answer_later(rclient, prefix: str, events_of, delay_s: float = 0.05) -> threading.Thread:
    """In a thread: wait for the enqueued request, then write `events_of(request_id)` one by one."""

    def run() -> None:
        message = wait_for_request(rclient, prefix)[-1]
        for event in events_of(message.id):
            time.sleep(delay_s)
            write_event(rclient, prefix, message.id, event)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_streamed_chat_relays_events_in_openai_format(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(rclient, prefix, lambda rid: [token(1, "Hel"), token(2, "lo"), done(3, "stop")])
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with api.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    request_id = response.headers["x-request-id"]
    events = parse_sse(response.text)
    assert [e.get("id") for e in events] == ["1", "2", "3", None, None]
    assert events[-1]["data"] == "[DONE]"
    parsed = chunks(events)
    assert all(c["id"] == request_id and c["object"] == "chat.completion.chunk" for c in parsed)
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert parsed[1]["choices"][0]["delta"] == {"content": "lo"}
    assert parsed[2]["choices"][0]["finish_reason"] == "stop"
    assert parsed[3]["choices"] == [] and parsed[3]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
    }
    assert all(c["usage"] is None for c in parsed[:3])

    message = wait_for_request(rclient, prefix)[0]
    assert message.id == request_id
    assert message.messages == [{"role": "user", "content": "Hi"}]
    assert message.params["max_tokens"] == 8
    assert message.deadline is not None and message.deadline > time.time()


def test_keep_alive_comes_only_while_idle_and_ends_no_event(start_api, rclient, prefix):
    """Tokens flow (0.1 s apart), stop for 2.5 s, flow again: `: ping` lines only in the silence, each alone
    (no blank line after it), and the openai SDK's decoder reads every event of the body as JSON."""
    from openai._streaming import SSEDecoder

    publish_model(rclient, prefix)
    api = start_api(sse_ping_s=1.0)
    silence_after = 12

    def run() -> None:
        rid = wait_for_request(rclient, prefix)[-1].id
        for seq in range(1, 2 * silence_after + 1):
            time.sleep(2.5 if seq == silence_after + 1 else 0.1)
            write_event(rclient, prefix, rid, token(seq, f"t{seq} "))
        write_event(rclient, prefix, rid, done(2 * silence_after + 1))

    threading.Thread(target=run, daemon=True).start()
    with (
        api.client() as client,
        client.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}) as response,
    ):
        raw = b"".join(response.iter_raw())
    text = raw.decode()
    flowing, silence, flowing_again = (
        text[text.index("id: 1\n") : text.index(f"id: {silence_after}\n")],
        text[text.index(f"id: {silence_after}\n") : text.index(f"id: {silence_after + 1}\n")],
        text[text.index(f"id: {silence_after + 1}\n") :],
    )
    assert "ping" not in flowing and "ping" not in flowing_again, text
    assert 1 <= silence.count(": ping\n") <= 3, silence
    assert ": ping\n\n" not in text and text.count("ping") == silence.count(": ping\n")
    decoded = list(SSEDecoder().iter_bytes(iter([raw])))
    assert [sse.data for sse in decoded][-1] == "[DONE]"
    parsed = [json.loads(sse.data) for sse in decoded[:-1]]
    sent = "".join(f"t{seq} " for seq in range(1, 2 * silence_after + 1))
    assert "".join(c["choices"][0]["text"] for c in parsed) == sent


def test_whole_completion_with_n_choices(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(
        rclient,
        prefix,
        lambda rid: [
            token(1, "a", index=1), token(2, "b", index=0), token(3, "c", index=1),
            done(4, "length", index=0, prompt=4, completion=1), done(5, "stop", index=1, prompt=4, completion=2),
        ],
    )  # fmt: skip
    with api.client() as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "abcd", "n": 2, "max_tokens": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == response.headers["x-request-id"]
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert [c["text"] for c in body["choices"]] == ["b", "ac"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "stop"]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert wait_for_request(rclient, prefix)[0].prompt == "abcd"


def test_gap_on_the_channel_is_filled_from_the_result_stream(start_api, rclient, prefix):
    """Events 2 and 3 are never published (a lost pub/sub message): the stream fills them in."""
    publish_model(rclient, prefix)
    api = start_api()

    def run() -> None:
        rid = wait_for_request(rclient, prefix)[-1].id
        write_event(rclient, prefix, rid, token(1, "one "))
        write_event(rclient, prefix, rid, token(2, "two "), publish=False)
        write_event(rclient, prefix, rid, token(3, "three "), publish=False)
        write_event(rclient, prefix, rid, token(4, "four"))
        write_event(rclient, prefix, rid, done(5))

    threading.Thread(target=run, daemon=True).start()
    with api.client() as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    events = parse_sse(response.text)
    assert [e.get("id") for e in events[:-1]] == ["1", "2", "3", "4", "5"]
    assert "".join(c["choices"][0]["text"] for c in chunks(events)) == "one two three four"


def test_silent_channel_is_polled(start_api, rclient, prefix):
    """Nothing is ever published: the relay still finishes by reading the result stream."""
    publish_model(rclient, prefix)
    api = start_api()

    def run() -> None:
        rid = wait_for_request(rclient, prefix)[-1].id
        for event in (token(1, "quiet"), done(2)):
            write_event(rclient, prefix, rid, event, publish=False)

    threading.Thread(target=run, daemon=True).start()
    with api.client() as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert response.json()["choices"][0]["text"] == "quiet"


def test_error_mid_stream_is_an_error_event_then_done(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(
        rclient, prefix, lambda rid: [token(1, "par"), ResultEvent(seq=2, type="error", error="the GPU caught fire")]
    )
    with api.client() as client:
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = parse_sse(response.text)
    assert events[-1]["data"] == "[DONE]"
    error = chunks(events)[-1]
    assert set(error) == {"error"} and error["error"]["message"] == "the GPU caught fire"
    assert error["error"]["type"] == "server_error" and events[-2]["id"] == "2"


def test_error_of_a_whole_request_is_500_in_the_envelope(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(rclient, prefix, lambda rid: [ResultEvent(seq=1, type="error", error="out of memory")])
    with api.client() as client:
        response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "generation_error"
    assert "out of memory" in response.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_cancelled_request_ends_in_a_request_cancelled_error_never_an_abort(start_api, rclient, prefix, stream):
    """The worker ends a cancelled request's open choices with done/"abort" (choice 0 finished before): a
    stream ends with the cancel error (its seq as id) and [DONE], no usage chunk; a whole request answers 499."""
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(
        rclient, prefix,
        lambda rid: [token(1, "a"), token(2, "b", index=1), done(3, "stop"), done(4, "abort", index=1)],
    )  # fmt: skip
    body = {**CHAT, "n": 2, "stream": stream} | ({"stream_options": {"include_usage": True}} if stream else {})
    with api.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    rid = response.headers["x-request-id"]
    assert "abort" not in response.text
    if stream:
        events = parse_sse(response.text)
        assert [e.get("id") for e in events] == ["1", "2", "3", "4", None] and events[-1]["data"] == "[DONE]"
        assert [c["choices"][0]["finish_reason"] for c in chunks(events)[:3]] == [None, None, "stop"]
        error = chunks(events)[-1]["error"]
    else:
        assert response.status_code == 499
        error = response.json()["error"]
    assert error["code"] == "request_cancelled" and f"request {rid} was cancelled" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_request_not_started_in_time_fails_and_is_cancelled(start_api, rclient, prefix, stream):
    """No worker ever takes it: past the queue timeout (+ slack) the API gives up and cancels."""
    import api.submit

    publish_model(rclient, prefix)
    old = api.submit.START_SLACK_S
    api.submit.START_SLACK_S = 0.0
    try:
        server = start_api(queue_timeout_s=0.5)
        with server.client() as client:
            started = time.monotonic()
            response = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": stream})
    finally:
        api.submit.START_SLACK_S = old
    assert time.monotonic() - started < 5
    rid = response.headers["x-request-id"]
    if stream:
        error = chunks(parse_sse(response.text))[-1]["error"]
    else:
        assert response.status_code == 503
        error = response.json()["error"]
    assert error["code"] == "queue_timeout"
    assert rclient.get(Keys(prefix).cancel(rid)) == "1"
    assert int(rclient.get(Keys(prefix).cancels)) >= 1  # and workers are told to look (worker/cancel.py)


def test_redis_lost_mid_stream_is_an_error_event_then_done(prefix):
    """Redis goes away while a client streams: it gets an error event naming how to resume, then [DONE]."""
    with RedisServer() as server:
        client = server.client(decode_responses=True)
        publish_model(client, prefix)
        api = ThreadApi(ApiSettings(redis_url=server.url, prefix=prefix, api_keys=[API_KEY])).start()
        try:
            with api.client() as http, http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                request_id = r.headers["x-request-id"]
                write_event(client, prefix, request_id, token(1, "Hi"))
                lines = r.iter_lines()
                assert json.loads(next(line for line in lines if line.startswith("data:"))[5:])["choices"]
                server.halt()
                rest = parse_sse("\n".join(lines) + "\n\n")
        finally:
            api.stop()
            client.close()
    error = json.loads(rest[-2]["data"])["error"]
    assert error["code"] == "backend_unavailable" and f"/v1/requests/{request_id}/stream" in error["message"]
    assert rest[-1]["data"] == "[DONE]"
