"""Structured output and tools through real workers and a real Redis: the message's `params.structured_output`
and `tools` are checked naming the field; a constraint that does not compile ends only its own request with
an error event naming the field, before any token; chat messages with tools and tool calls reach the
template; a worker killed mid-way through constrained requests is taken over and every result equals the
uninterrupted run with the same seed and still validates."""

from __future__ import annotations

import json

import jsonschema
import pytest

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
from tests.worker.test_worker_processes import _submit_all, _wait_all, _wait_events
from worker.protocol import Keys, ProtocolError, decode_request

pytestmark = pytest.mark.timeout(180)

# bounded, so a random model's output ends: a string of at most 60 characters, then one of three numbers
SCHEMA = {
    "type": "object",
    "properties": {"word": {"type": "string", "maxLength": 60}, "n": {"enum": [1, 2, 3]}},
    "required": ["word", "n"],
    "additionalProperties": False,
}


@pytest.fixture
def engine(worker_model_dir):
    from engine import CacheConfig, EngineConfig, LLMEngine, ModelConfig

    config = EngineConfig(
        model=ModelConfig(str(worker_model_dir), dtype="float32", max_model_len=256),
        cache=CacheConfig(num_kv_tokens=4096),
        device="cpu",
    )
    return LLMEngine(config)


def _decode(**fields) -> None:
    values = {"v": "1", "id": "a", "messages": json.dumps([{"role": "user", "content": "hi"}])}
    values.update({name: json.dumps(value) for name, value in fields.items()})
    decode_request(values)


@pytest.mark.parametrize(
    "fields,field",
    [
        ({"params": {"structured_output": {"regex": "a", "choice": ["a"]}}}, "params.structured_output"),
        ({"params": {"structured_output": {"yaml": "a"}}}, "params.structured_output"),
        ({"params": {"structured_output": {"json": "[1]"}}}, "params.structured_output.json"),
        ({"params": {"structured_output": {"json_object": False}}}, "params.structured_output.json_object"),
        ({"params": {"structured_output": {"regex": ""}}}, "params.structured_output.regex"),
        ({"params": {"structured_output": {"grammar": 5}}}, "params.structured_output.grammar"),
        ({"params": {"structured_output": {"choice": [f"c{i}" for i in range(257)]}}},
         "params.structured_output.choice"),
        ({"params": {"structured_output": {"choice": ["a", ""]}}}, "params.structured_output.choice[1]"),
        ({"params": {"structured_output": {"regex": "a" * 65_537}}}, "params.structured_output.regex"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * 129}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
         "tools[0].function.parameters"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": {"id": "x"}}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "tool", "content": "1", "tool_call_id": 7}]}, "messages[0].tool_call_id"),
    ],
)  # fmt: skip
def test_bad_structured_output_and_tools_name_the_field(fields, field):
    with pytest.raises(ProtocolError) as info:
        _decode(**fields)
    assert info.value.field == field, info.value


def test_good_structured_output_and_tools_decode():
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "1", "tool_call_id": "c1", "name": "f"},
    ]  # fmt: skip
    for constraint in ({"json": SCHEMA}, {"json_object": True}, {"regex": "a+"}, {"choice": ["x"]},
                       {"grammar": 'root ::= "a"'}, None):  # fmt: skip
        _decode(params={"structured_output": constraint}, tools=tools, messages=messages)


def test_bad_constraint_errors_alone_and_tools_reach_the_template(redis_server, prefix, worker_model_dir, engine):
    keys, client = Keys(prefix), redis_server.client()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"},
    ]  # fmt: skip
    with ThreadWorker(make_settings(redis_server, prefix, worker_model_dir), engine=engine):
        submit(
            client, keys, "bad", prompt="x", params={"max_tokens": 8, "structured_output": {"grammar": "root ::= y"}}
        )
        params = {"max_tokens": 120, "temperature": 0.7, "seed": 1, "structured_output": {"json": SCHEMA}}
        submit(client, keys, "good", messages=messages, tools=tools, params=params)
        results = wait_complete(client, keys, ["bad", "good"], timeout_s=60)
    bad = results["bad"]
    assert [e.type for e in bad] == ["error"], bad
    assert bad[0].error.startswith("structured_output.grammar: "), bad[0].error
    good = results["good"]
    assert good[-1].type == "done" and good[-1].finish_reason == "stop", good[-1]
    jsonschema.validate(json.loads("".join(e.text for e in good if e.type == "token")), SCHEMA)
    # the template rendered the tool turn: the prompt counted holds the tool's answer
    prompt_ids = engine.apply_chat_template(messages, tools=tools)
    assert "sunny" in engine.tokenizer.decode(prompt_ids)
    assert good[-1].usage["prompt_tokens"] == len(prompt_ids)


# long enough that the victim is still writing when it is killed, a survivor having started meanwhile
LONG_SCHEMA = SCHEMA | {"properties": {"word": {"type": "string", "maxLength": 400}, "n": {"enum": [1, 2, 3]}}}


def test_kill_9_mid_constrained_generation_resumes_exactly(redis_server, prefix, worker_model_dir, engine, tmp_path):
    keys, client = Keys(prefix), redis_server.client()
    requests = {
        f"json-{i}": (engine.encode(f"Job {i} says"), {"temperature": 0.9, "seed": 70 + i, "max_tokens": 200,
                                                       "structured_output": {"json": LONG_SCHEMA}})
        for i in range(6)
    }  # fmt: skip
    requests["json-n2"] = (engine.encode("Two of them"), {"temperature": 0.9, "seed": 5, "n": 2, "max_tokens": 200,
                                                          "structured_output": {"json": LONG_SCHEMA}})  # fmt: skip
    settings = make_settings(redis_server, prefix, worker_model_dir, lease_ms=1500)
    with ProcessWorker(settings, tmp_path / "victim.log") as victim:
        victim.wait_ready(client, keys)
        _submit_all(client, keys, requests)
        _wait_events(client, keys, list(requests), at_least=1)
        with ThreadWorker(settings, engine=engine):
            _wait_events(client, keys, list(requests), at_least=2)
            victim.kill()
            cut = [rid for rid in requests if all(e.type == "token" for _, e in read_events(client, keys, rid))]
            assert len(cut) >= 3, cut  # killed mid-way through these: their matchers resume from emitted tokens
            results = _wait_all(client, keys, requests, timeout_s=90)
    expected = offline_outputs(engine, requests)
    for request_id, (_, params) in requests.items():
        n = params.get("n", 1)
        events = assert_exactly_once(client, keys, request_id, n=n)
        assert tokens_by_index(results[request_id]) == expected[request_id], request_id
        for index in range(n):
            text = "".join(e.text for e in events if e.type == "token" and e.index == index)
            jsonschema.validate(json.loads(text), LONG_SCHEMA)
