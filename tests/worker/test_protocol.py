"""The wire contract, pure and fast: round trips, validation messages, key names."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from worker import protocol
from worker.protocol import (
    Keys,
    ModelInfo,
    ProtocolError,
    RequestMessage,
    ResultEvent,
    WorkerHeartbeat,
    decode_event,
    decode_request,
    encode_dead_letter,
    encode_event,
    encode_event_for_write,
    encode_request,
    event_to_json,
    is_complete,
)


def test_keys_derive_every_name_from_the_prefix():
    keys = Keys("acme")
    assert keys.requests == "acme:requests"
    assert keys.group == "acme:workers"
    assert keys.dead == "acme:dead"
    assert keys.model == "acme:model"
    assert keys.result("r1") == "acme:result:r1"
    assert keys.events("r1") == "acme:events:r1"
    assert keys.cancel("r1") == "acme:cancel:r1"
    assert keys.owner("r1") == "acme:owner:r1"
    assert keys.worker("host-1-ab") == "acme:worker:host-1-ab"
    assert keys.worker_pattern == "acme:worker:*"
    assert Keys().requests == "inferq:requests"


def test_stream_ids_are_explicit_and_parse_back():
    assert protocol.stream_id(7) == "0-7"
    assert protocol.seq_from_stream_id(b"0-42") == 42


@pytest.mark.parametrize(
    "message",
    [
        RequestMessage(id="a", prompt="Hello"),
        RequestMessage(id="b.c:d-e_1", messages=[{"role": "user", "content": "hi"}], priority=-3),
        RequestMessage(
            id="x" * 128,
            prompt_token_ids=[1, 2, 3],
            params={"temperature": 0, "max_tokens": 4, "logit_bias": {5: 1.5}, "stop": ["\n"]},
            deadline=1_700_000_000.25,
            result_stream="custom:stream",
            created=1_700_000_000.0,
            whole=True,
        ),
    ],
)
def test_request_round_trip(message):
    fields = encode_request(message)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
    assert fields["v"] == "1"
    assert decode_request(fields) == message
    # redis-py without decode_responses hands back bytes
    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}
    assert decode_request(as_bytes) == message


def test_plain_fields_from_another_language_decode():
    fields = {
        "v": "1",
        "id": "job-1",
        "prompt_token_ids": "[1, 2]",
        "params": '{"logit_bias": {"7": -100}, "max_tokens": 3}',
        "priority": "2",
        "future_field": "ignored",
    }
    message = decode_request(fields)
    assert message.params == {"logit_bias": {7: -100}, "max_tokens": 3}
    assert message.priority == 2
    assert message.result_stream_for(Keys()) == "inferq:result:job-1"


@pytest.mark.parametrize(
    ("fields", "field_name", "fragment"),
    [
        ({"id": "a", "prompt": "x"}, "v", "must be '1'"),
        ({"v": "2", "id": "a", "prompt": "x"}, "v", "must be '1'"),
        ({"v": "1", "prompt": "x"}, "id", "must match"),
        ({"v": "1", "id": "bad id", "prompt": "x"}, "id", "must match"),
        ({"v": "1", "id": "a" * 129, "prompt": "x"}, "id", "128"),
        ({"v": "1", "id": "a"}, "prompt", "exactly one"),
        ({"v": "1", "id": "a", "prompt": "x", "prompt_token_ids": "[1]"}, "prompt", "exactly one"),
        ({"v": "1", "id": "a", "prompt": ""}, "prompt", "non-empty"),
        ({"v": "1", "id": "a", "messages": "{"}, "messages", "not valid JSON"),
        ({"v": "1", "id": "a", "messages": "[]"}, "messages", "non-empty"),
        ({"v": "1", "id": "a", "messages": '[{"content": "x"}]'}, "messages[0]", "role"),
        ({"v": "1", "id": "a", "messages": '[{"role": "user", "content": 3}]'}, "messages[0].content", "string"),
        ({"v": "1", "id": "a", "prompt_token_ids": "[1, -2]"}, "prompt_token_ids", "non-negative"),
        ({"v": "1", "id": "a", "prompt_token_ids": "[1.5]"}, "prompt_token_ids", "non-negative"),
        ({"v": "1", "id": "a", "prompt_token_ids": "[1, true]"}, "prompt_token_ids", "non-negative"),
        ({"v": "1", "id": "a", "prompt_token_ids": '[1, "2"]'}, "prompt_token_ids", "non-negative"),
        ({"v": "1", "id": "a", "prompt_token_ids": "[]"}, "prompt_token_ids", "non-empty"),
        ({"v": "1", "id": "a", "prompt": "x", "params": "[1]"}, "params", "JSON object"),
        ({"v": "1", "id": "a", "prompt": "x", "params": '{"temp": 1}'}, "params", "unknown"),
        ({"v": "1", "id": "a", "prompt": "x", "params": '{"logit_bias": {"x": 1}}'}, "params.logit_bias", "integer"),
        ({"v": "1", "id": "a", "prompt": "x", "priority": "high"}, "priority", "integer"),
        ({"v": "1", "id": "a", "prompt": "x", "deadline": "soon"}, "deadline", "number"),
        ({"v": "1", "id": "a", "prompt": "x", "deadline": "nan"}, "deadline", "finite"),
        ({"v": "1", "id": "a", "prompt": "x", "result_stream": ""}, "result_stream", "1 to"),
        ({"v": "1", "id": "a", "prompt": "x", "whole": "yes"}, "whole", "must be 1 or 0"),
    ],
)
def test_bad_requests_name_the_field(fields, field_name, fragment):
    with pytest.raises(ProtocolError) as info:
        decode_request(fields)
    assert info.value.field == field_name
    assert fragment in str(info.value)


def test_encode_request_validates_too():
    with pytest.raises(ProtocolError, match="exactly one"):
        encode_request(RequestMessage(id="a"))
    with pytest.raises(ProtocolError, match="unknown"):
        encode_request(RequestMessage(id="a", prompt="x", params={"best_of": 2}))


def test_request_id_of_reads_a_valid_id_even_from_a_broken_message():
    assert protocol.request_id_of({b"id": b"r-1", b"prompt_token_ids": b"nope"}) == "r-1"
    assert protocol.request_id_of({"id": "not valid!"}) is None
    assert protocol.request_id_of({}) is None


@pytest.mark.parametrize(
    "event",
    [
        ResultEvent(seq=1, type="token", text="Hel", token_ids=[1, 2], worker="w1"),
        ResultEvent(seq=2, type="token", index=1, text="", token_ids=[], logprobs=[{"token_id": 1, "logprob": -0.5}]),
        ResultEvent(
            seq=2,
            type="token",
            text="é",
            token_ids=[7],
            logprobs=[{"token_id": 7, "logprob": -0.1, "top": {}}],
            prompt_logprobs=[{"token_id": 5, "logprob": None, "top": {}}, {"token_id": 6, "logprob": -2.0, "top": {}}],
        ),
        ResultEvent(
            seq=3,
            type="done",
            finish_reason="length",
            usage={"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        ),
        ResultEvent(seq=4, type="error", error="deadline passed"),
    ],
)
def test_event_round_trips_through_stream_fields_and_json(event):
    fields = encode_event(event)
    assert all(isinstance(v, str) for v in fields.values())
    assert decode_event(fields) == dataclasses.replace(
        event,
        text=event.text if event.type == "token" else None,
        token_ids=event.token_ids if event.type == "token" else None,
    )
    payload = json.loads(event_to_json(event))
    assert payload["seq"] == event.seq and isinstance(payload["seq"], int)
    assert decode_event(event_to_json(event)) == decode_event(fields)
    assert decode_event({k.encode(): v.encode() for k, v in fields.items()}) == decode_event(fields)
    assert encode_event_for_write(event) == (fields, event_to_json(event))  # the worker's one-pass form


@pytest.mark.parametrize(
    ("event", "field_name"),
    [
        (ResultEvent(seq=0, type="token"), "seq"),
        (ResultEvent(seq=1, type="tokens"), "type"),
        (ResultEvent(seq=1, type="done", finish_reason="finished"), "finish_reason"),
        (ResultEvent(seq=1, type="error"), "error"),
        (ResultEvent(seq=1, type="token", index=-1), "index"),
    ],
)
def test_bad_events_are_refused(event, field_name):
    with pytest.raises(ProtocolError) as info:
        encode_event(event)
    assert info.value.field == field_name


def test_completion_needs_every_choice_or_one_error():
    done0 = ResultEvent(seq=2, type="done", index=0, finish_reason="stop")
    done1 = ResultEvent(seq=3, type="done", index=1, finish_reason="length")
    token = ResultEvent(seq=1, type="token", text="a", token_ids=[1])
    assert not is_complete([token])
    assert is_complete([token, done0])
    assert not is_complete([token, done0], n=2)
    assert is_complete([token, done0, done1], n=2)
    assert is_complete([token, ResultEvent(seq=2, type="error", error="boom")], n=4)


def test_dead_letter_keeps_the_original_fields():
    letter = encode_dead_letter("r1", "params: unknown", b"1-0", {b"v": b"1", b"id": b"r1"})
    assert letter["reason"] == "params: unknown"
    assert letter["message_id"] == "1-0"
    assert json.loads(letter["fields"]) == {"v": "1", "id": "r1"}


def test_heartbeat_and_model_info_round_trip():
    beat = WorkerHeartbeat("c", "m", 128, 1.0, 2.0, running=3, waiting=1, free_kv_tokens=64)
    assert WorkerHeartbeat.from_json(beat.to_json()) == beat
    info = ModelInfo("served", 2048, 49152, [2])
    assert ModelInfo.from_json(info.to_json().encode()) == info


def test_consumer_names_are_unique_per_call():
    assert protocol.make_consumer_name() != protocol.make_consumer_name()


def test_protocol_is_stdlib_only():
    code = "import sys, worker.protocol; bad = {'torch', 'redis', 'engine'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_param_names_match_the_engine_sampling_params():
    from engine.sampling_params import SamplingParams

    names = {f.name for f in dataclasses.fields(SamplingParams)}
    assert names == protocol.SAMPLING_PARAM_FIELDS


def test_bytes_that_are_not_utf8_are_a_protocol_error():
    with pytest.raises(ProtocolError) as info:
        decode_request({b"v": b"1", b"id": b"a", b"prompt": b"\xff"})
    assert info.value.field == "prompt" and "UTF-8" in info.value.reason
    assert protocol.request_id_of({b"id": b"a", b"prompt": b"\xff"}) == "a"
    assert "\ufffd" in encode_dead_letter("a", "bad", "1-0", {b"prompt": b"\xff"})["fields"]
