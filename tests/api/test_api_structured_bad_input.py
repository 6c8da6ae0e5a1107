"""Structured output and tools at the API: every bad input a 400 in OpenAI's envelope naming the field,
with nothing enqueued; a good one becomes the documented request message (params.structured_output,
tools, tool calls of earlier turns).

No worker runs: the model and a byte tokenizer are published as a worker would, and the test reads the
request stream.
"""

from __future__ import annotations

import json
import secrets

import httpx
import pytest

from api.settings import ApiSettings
from tests.api.servers import API_KEY, ThreadApi
from tests.api.wire import MODEL, assert_envelope, publish_model, stream_len, wait_for_request

MSG = [{"role": "user", "content": "Hi"}]
CHAT_URL, COMP_URL = "/v1/chat/completions", "/v1/completions"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": MSG, "max_tokens": 8, **fields}


def comp(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 8, **fields}


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


# (id, url, body, param, text the message holds, code)
CASES = [
    ("schema-bad-type", CHAT_URL, chat(response_format=schema_format({"type": "nope"})),
     "response_format.json_schema.schema.type", "not a valid JSON Schema", "invalid_constraint"),
    ("schema-bad-required", CHAT_URL, chat(response_format=schema_format({"type": "object", "required": "a"})),
     "response_format.json_schema.schema.required", "not a valid JSON Schema", "invalid_constraint"),
    ("schema-missing", CHAT_URL, chat(response_format={"type": "json_schema", "json_schema": {"name": "a"}}),
     "response_format.json_schema.schema", "required", "invalid_constraint"),
    ("schema-not-object", COMP_URL, comp(structured_outputs={"json": "[1, 2]"}), "structured_outputs.json",
     "must be a JSON Schema object", "invalid_constraint"),
    ("schema-text-not-json", COMP_URL, comp(guided_json="{type: object}"), "guided_json", "not valid JSON",
     "invalid_constraint"),
    ("keyword-multipleOf", CHAT_URL, chat(response_format=schema_format(
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}})),
     "response_format.json_schema.schema.properties.n.multipleOf", "'multipleOf' is not supported",
     "invalid_constraint"),
    ("keyword-if", COMP_URL, comp(guided_json={"if": {"type": "string"}, "then": {"minLength": 2}}),
     "guided_json.if", "'if' is not supported", "invalid_constraint"),
    ("keyword-not", COMP_URL, comp(guided_json={"items": {"not": {"type": "null"}}}), "guided_json.items.not",
     "'not' is not supported", "invalid_constraint"),
    ("remote-ref", CHAT_URL, chat(structured_outputs={"json": {"$ref": "https://example.com/s.json"}}),
     "structured_outputs.json.$ref", "only references inside the schema", "invalid_constraint"),
    ("all-of-two", CHAT_URL, chat(guided_json={"allOf": [{"type": "object"}, {"required": ["a"]}]}),
     "guided_json.allOf", "more than one schema", "invalid_constraint"),
    ("unknown-format", CHAT_URL, chat(guided_json={"type": "string", "format": "credit-card"}),
     "guided_json.format", "'credit-card' is not supported", "invalid_constraint"),
    ("pattern-properties-with-properties", CHAT_URL, chat(guided_json={
        "type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}}),
     "guided_json.patternProperties", "additionalProperties false", "invalid_constraint"),
    ("schema-pattern-lookahead", CHAT_URL, chat(guided_json={"type": "string", "pattern": "^(?=a)a+$"}),
     "guided_json.pattern", "lookahead", "invalid_constraint"),
    ("regex-does-not-compile", COMP_URL, comp(structured_outputs={"regex": "[a-z"}), "structured_outputs.regex",
     "does not compile", "invalid_constraint"),
    ("regex-backreference", CHAT_URL, chat(guided_regex=r"(a)\1"), "guided_regex", "backreferences",
     "invalid_constraint"),
    ("regex-lookbehind", COMP_URL, comp(guided_regex=r"(?<!x)y"), "guided_regex", "lookahead/lookbehind",
     "invalid_constraint"),
    ("regex-word-boundary", COMP_URL, comp(guided_regex=r"\bword"), "guided_regex", "anchors", "invalid_constraint"),
    ("regex-inline-flag", COMP_URL, comp(guided_regex=r"(?i)yes"), "guided_regex", "flags", "invalid_constraint"),
    ("choice-empty", COMP_URL, comp(structured_outputs={"choice": []}), "structured_outputs.choice",
     "at least 1", "invalid_value"),
    ("choice-empty-string", COMP_URL, comp(guided_choice=["yes", ""]), "guided_choice[1]", "at least 1",
     "invalid_value"),
    ("choice-not-strings", CHAT_URL, chat(guided_choice=["yes", 1]), "guided_choice[1]", "valid string",
     "invalid_value"),
    ("choice-257", CHAT_URL, chat(guided_choice=[str(i) for i in range(257)]), "guided_choice", "at most 256",
     "invalid_value"),
    ("grammar-empty", COMP_URL, comp(structured_outputs={"grammar": "  \n"}), "structured_outputs.grammar",
     "empty", "invalid_constraint"),
    ("grammar-too-long", COMP_URL, comp(guided_grammar="x" * 65_537), "guided_grammar", "at most 65536",
     "invalid_value"),
    ("schema-too-long", COMP_URL, comp(guided_json={"enum": ["x" * 1000] * 70}), "guided_json", "the limit is 65536",
     "invalid_constraint"),
    ("two-structured-outputs", COMP_URL, comp(structured_outputs={"regex": "a", "choice": ["a"]}),
     "structured_outputs", "exactly one", "invalid_constraint"),
    ("two-constraints", CHAT_URL, chat(response_format={"type": "json_object"}, guided_regex="a+"),
     "guided_regex", "only one structured output constraint", "invalid_constraint"),
    ("tool-choice-unknown", CHAT_URL, chat(tools=[WEATHER], tool_choice={"type": "function",
     "function": {"name": "get_time"}}), "tool_choice.function.name", "'get_time' is not one of the tools",
     "unknown_tool"),
    ("tool-choice-without-tools", CHAT_URL, chat(tool_choice="required"), "tool_choice", "no tools",
     "invalid_tools"),
    ("tool-names-twice", CHAT_URL, chat(tools=[WEATHER, WEATHER]), "tools[1].function.name", "also the name",
     "invalid_tools"),
    ("tool-name-bad", CHAT_URL, chat(tools=[{"type": "function", "function": {"name": "get weather"}}]),
     "tools[0].function.name", "pattern", "invalid_value"),
    ("tool-parameters-bad", CHAT_URL, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": 5}}}}}]), "tools[0].function.parameters.properties.a.type",
     "not a valid JSON Schema", "invalid_constraint"),
    ("tool-parameters-unsupported", CHAT_URL, chat(tools=[{"type": "function", "function": {"name": "f",
     "parameters": {"type": "object", "properties": {"a": {"uniqueItems": True}}}}}], tool_choice="required"),
     "tools[0].function.parameters.properties.a.uniqueItems", "not supported", "invalid_constraint"),
    ("tool-choice-and-format", CHAT_URL, chat(tools=[WEATHER], tool_choice="required",
     response_format={"type": "json_object"}), "response_format", "constrains the output already",
     "invalid_constraint"),
    ("tools-on-completions", COMP_URL, comp(tools=[WEATHER]), "tools", "not supported", "invalid_value"),
    ("tool-calls-on-user", CHAT_URL, chat(messages=[{"role": "user", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
     "messages[0].tool_calls", "only assistant", "invalid_value"),
    ("tool-message-without-content", CHAT_URL, chat(messages=[{"role": "tool", "tool_call_id": "1"}]),
     "messages[0].content", "required", "invalid_value"),
]  # fmt: skip


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"so{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def api(redis_server, module_prefix):
    with redis_server.client(decode_responses=True) as client:
        publish_model(client, module_prefix, max_model_len=512)
    server = ThreadApi(ApiSettings(redis_url=redis_server.url, prefix=module_prefix, api_keys=[API_KEY])).start()
    yield server
    server.stop()


@pytest.fixture
def prefix(module_prefix) -> str:
    return module_prefix


@pytest.mark.parametrize(("url", "body", "param", "says", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_bad_constraint_or_tools_is_400_naming_the_field_and_nothing_is_enqueued(
    api, rclient, prefix, url, body, param, says, code, stream
):
    before = stream_len(rclient, prefix)
    with api.client() as client:
        response = client.post(url, json=body | {"stream": stream})
    error = assert_envelope(response, 400)
    assert error["param"] == param, error
    assert says in error["message"] and error["message"].startswith(param), error
    assert error["code"] == code, error
    assert stream_len(rclient, prefix) == before


def _sent(api, rclient, prefix, url: str, body: dict):
    """The request message `body` becomes (its answer is not awaited: no worker runs)."""
    before = stream_len(rclient, prefix)
    try:
        with api.client() as client, client.stream("POST", url, json=body | {"stream": True}, timeout=0.5) as _:
            pass
    except httpx.TimeoutException:
        pass  # a constrained stream's headers wait for the worker's first event
    return wait_for_request(rclient, prefix, count=before + 1)[-1]


@pytest.mark.parametrize(
    ("url", "body", "constraint"),
    [(CHAT_URL, chat(response_format={"type": "json_object"}), {"json_object": True}),
     (CHAT_URL, chat(response_format=schema_format({"type": "integer"})), {"json": {"type": "integer"}}),
     (COMP_URL, comp(response_format=schema_format({"type": "integer"})), {"json": {"type": "integer"}}),
     (COMP_URL, comp(structured_outputs={"json": '{"type": "boolean"}'}), {"json": {"type": "boolean"}}),
     (COMP_URL, comp(structured_outputs={"regex": "[0-9]{3}"}), {"regex": "[0-9]{3}"}),
     (CHAT_URL, chat(structured_outputs={"choice": ["yes", "no"]}), {"choice": ["yes", "no"]}),
     (COMP_URL, comp(guided_choice=["a"]), {"choice": ["a"]}),
     (COMP_URL, comp(guided_regex="^a+$"), {"regex": "^a+$"}),
     (COMP_URL, comp(guided_grammar='root ::= "a" | "b"'), {"grammar": 'root ::= "a" | "b"'}),
     (CHAT_URL, chat(response_format={"type": "text"}), None)],
    ids=["json-object", "json-schema", "completion-json-schema", "schema-as-text", "regex", "choice",
         "guided-choice", "guided-regex", "guided-grammar", "text"],
)  # fmt: skip
def test_each_constraint_field_becomes_params_structured_output(api, rclient, prefix, url, body, constraint):
    message = _sent(api, rclient, prefix, url, body)
    assert message.params.get("structured_output") == constraint
    assert len(json.dumps(message.params.get("structured_output"))) <= 65_536


def test_tools_go_to_the_template_and_forced_choices_send_their_constraint(api, rclient, prefix):
    message = _sent(api, rclient, prefix, CHAT_URL, chat(tools=[WEATHER, TIME]))
    assert message.tools == [WEATHER, TIME] and "structured_output" not in message.params
    message = _sent(api, rclient, prefix, CHAT_URL, chat(tools=[WEATHER, TIME], tool_choice="none"))
    assert message.tools == [WEATHER, TIME] and "structured_output" not in message.params
    named = {"type": "function", "function": {"name": "get_weather"}}
    message = _sent(api, rclient, prefix, CHAT_URL, chat(tools=[WEATHER, TIME], tool_choice=named))
    assert message.params["structured_output"] == {"json": WEATHER["function"]["parameters"]}
    message = _sent(api, rclient, prefix, CHAT_URL, chat(tools=[WEATHER, TIME], tool_choice="required"))
    schema = message.params["structured_output"]["json"]
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    calls = schema["items"]["anyOf"]
    assert [c["properties"]["name"] for c in calls] == [{"const": "get_weather"}, {"const": "get_time"}]
    assert calls[1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    message = _sent(
        api, rclient, prefix, CHAT_URL, chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    )
    assert message.params["structured_output"]["json"]["maxItems"] == 1


def test_earlier_tool_calls_and_results_reach_the_template(api, rclient, prefix):
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]  # fmt: skip
    message = _sent(api, rclient, prefix, CHAT_URL, chat(messages=turns, tools=[WEATHER]))
    assert message.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}],
    }  # fmt: skip
    assert message.messages[2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}
