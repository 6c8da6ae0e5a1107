"""A constraint the worker cannot compile, as the worker reports it (an error event starting with
`structured_output`, before any token): a 400 naming the request field, whole and streamed (a constrained
stream's headers wait for its first event); after a keep-alive started the stream, an SSE error event with
the same envelope. Tool calls of a whole answer are read from the worker's text. No worker runs: the test
writes the events into Redis as one would."""

from __future__ import annotations

import json
import threading
import time

import pytest

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
from worker.protocol import ResultEvent

COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 8, "structured_outputs": {"grammar": "root ::= x"}}


def answer_later(rclient, prefix: str, events_of, delay_s: float = 0.05) -> threading.Thread:
    def run() -> None:
        message = wait_for_request(rclient, prefix)[-1]
        for event in events_of(message):
            time.sleep(delay_s)
            write_event(rclient, prefix, message.id, event)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def compile_error(seq: int = 1) -> ResultEvent:
    return ResultEvent(seq=seq, type="error", error="structured_output: undefined rule 'x' in the grammar")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_constraint_the_worker_cannot_compile_is_400_naming_the_field(start_api, rclient, prefix, stream):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(rclient, prefix, lambda message: [compile_error()])
    with api.client() as client:
        response = client.post("/v1/completions", json=COMPLETION | {"stream": stream})
    error = assert_envelope(response, 400)
    assert error["param"] == "structured_outputs.grammar" and error["code"] == "invalid_constraint", error
    assert "undefined rule 'x'" in error["message"], error
    assert response.headers["x-request-id"].startswith("cmpl-")


def test_a_failure_after_a_keep_alive_is_an_sse_error_event_with_the_same_code(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api(sse_ping_s=0.3)
    answer_later(rclient, prefix, lambda message: [compile_error()], delay_s=1.0)
    with api.client() as client:
        response = client.post("/v1/completions", json=COMPLETION | {"stream": True})
    assert response.status_code == 200 and ": ping" in response.text
    (error,) = chunks(parse_sse(response.text))
    assert error["error"]["code"] == "invalid_constraint" and error["error"]["param"] == "structured_outputs.grammar"


def test_an_unconstrained_error_stays_a_generation_error(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(rclient, prefix, lambda message: [ResultEvent(seq=1, type="error", error="structured_output x")])
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 8}
    with api.client() as client:
        response = client.post("/v1/completions", json=body)
    assert assert_envelope(response, 500)["code"] == "generation_error"


def test_a_constrained_stream_starts_with_its_first_token(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    answer_later(rclient, prefix, lambda message: [token(1, "x"), done(2)])
    with api.client() as client:
        response = client.post("/v1/completions", json=COMPLETION | {"stream": True})
    assert response.status_code == 200
    assert [c["choices"][0]["text"] for c in chunks(parse_sse(response.text))] == ["x", ""]


def test_whole_tool_calls_from_the_worker_text(start_api, rclient, prefix):
    publish_model(rclient, prefix)
    api = start_api()
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}  # fmt: skip
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    answer_later(rclient, prefix, lambda message: [token(1, text[:20]), token(2, text[20:]), done(3)])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Time?"}], "max_tokens": 8, "tools": [tool]}
    with api.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time" and json.loads(call["function"]["arguments"]) == {"zone": "UTC"}
    assert choice["message"]["content"] is None
