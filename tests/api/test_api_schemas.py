"""Pure checks of the request models against the wire contract (no server, no Redis)."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from pydantic import ValidationError

from api.main import create_app
from api.output_plan import plan_output
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.settings import ApiSettings
from worker.protocol import SAMPLING_PARAM_FIELDS, RequestMessage, decode_request, encode_request

EVERYTHING = {
    "model": "m", "n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.1,
    "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"5": -3}, "seed": 7, "stop": ["\n\n", "END"],
    "stop_token_ids": [2], "min_tokens": 1, "ignore_eos": True, "skip_special_tokens": False, "priority": -1,
    "speculative": False,
    "user": "u-1", "max_tokens": 9,
}  # fmt: skip


def test_every_sampling_field_reaches_the_worker_under_its_engine_name():
    body = ChatCompletionRequest(
        **EVERYTHING, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=3,
        response_format={"type": "json_object"},
    )  # fmt: skip
    # NOTE: the constraint is checked and added by the output plan (api/output_plan.py), as api/submit.py does.
    constraint = {"structured_output": plan_output(body, None, ApiSettings()).constraint}
    params = body.engine_params(9, body.engine_logprobs()) | constraint
    # every engine field is reachable, under its own name (prompt_logprobs through a completion's echo)
    assert set(params) == SAMPLING_PARAM_FIELDS - {"prompt_logprobs"}
    echo = CompletionRequest(**EVERYTHING | {"max_tokens": 0}, prompt="hi", echo=True, logprobs=2, guided_regex="a")
    echo_params = echo.engine_params(0, echo.engine_logprobs()) | {
        "structured_output": plan_output(echo, None, ApiSettings()).constraint
    }
    assert echo_params["prompt_logprobs"] == 2 and echo_params["max_tokens"] == 1  # the one token is not shown
    assert set(echo_params) == SAMPLING_PARAM_FIELDS
    message = RequestMessage(id="chatcmpl-1", messages=body.wire_messages(), params=params, priority=body.priority)
    decoded = decode_request(encode_request(message))
    assert decoded.params["logit_bias"] == {5: -3}
    assert decoded.params["logprobs"] == 3 and decoded.params["stop"] == ["\n\n", "END"]
    assert decoded.priority == -1 and decoded.params["structured_output"] == {"json_object": True}


def test_defaults_send_only_what_the_client_chose():
    body = CompletionRequest(model="m", prompt="x")
    assert body.engine_params(16, body.engine_logprobs()) == {"n": 1, "max_tokens": 16}


def test_prompt_forms():
    assert CompletionRequest(model="m", prompt="text").single_prompt() == "text"
    assert CompletionRequest(model="m", prompt=[1, 2]).single_prompt() == [1, 2]
    assert CompletionRequest(model="m", prompt=["text"]).single_prompt() == "text"
    assert CompletionRequest(model="m", prompt=[[3, 4]]).single_prompt() == [3, 4]
    with pytest.raises(ValidationError, match="send one prompt per request"):
        CompletionRequest(model="m", prompt=[[3], [4]])


def test_chat_content_parts_are_joined_and_developer_is_a_system_message():
    body = ChatCompletionRequest(
        model="m",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
    )
    assert body.wire_messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]


def test_max_completion_tokens_wins_over_max_tokens():
    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5, max_completion_tokens=7
    )
    assert body.requested_max_tokens() == 7


@pytest.mark.parametrize(
    "extra",
    [{"tool_choice": "none"}, {"response_format": {"type": "text"}}, {"modalities": ["text"]}, {"tools": []},
     {"some_future_field": 1}],
)  # fmt: skip
def test_neutral_values_of_unsupported_features_and_unknown_fields_are_accepted(extra):
    ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **extra)


def test_integral_floats_are_integers_and_reach_the_worker_as_ints():
    """JSON Schema's integer admits 5.0 (so does vLLM); the engine gets the int."""
    body = CompletionRequest(
        model="m", prompt=[1.0, 2], n=2.0, best_of=2.0, top_k=40.0, seed=7.0, stop_token_ids=[3.0], min_tokens=1.0,
        logprobs=2.0, priority=-1.0, max_tokens=3.0,
    )  # fmt: skip
    params = body.engine_params(body.max_tokens, body.engine_logprobs())
    for name, want in {"n": 2, "top_k": 40, "seed": 7, "min_tokens": 1, "logprobs": 2, "max_tokens": 3}.items():
        assert params[name] == want and type(params[name]) is int, name
    assert params["stop_token_ids"] == [3] and type(params["stop_token_ids"][0]) is int
    assert body.single_prompt() == [1, 2] and all(type(t) is int for t in body.single_prompt())
    assert body.priority == -1 and type(body.priority) is int


@pytest.mark.parametrize(
    "fields",
    [{"n": 2.5}, {"n": True}, {"n": "2"}, {"top_k": 1e300}, {"max_tokens": float("inf")}, {"seed": -1.0},
     {"prompt": [1, 2.5]}, {"stop_token_ids": [True]}, {"temperature": "0.5"}, {"temperature": True}],
)  # fmt: skip
def test_types_stay_strict(fields):
    with pytest.raises(ValidationError):
        CompletionRequest(**{"model": "m", "prompt": "x", **fields})


def test_logit_bias_keys_are_ascii_token_ids_leading_zeros_read_as_vllm_does():
    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], logit_bias={"007": 5, "0": -1, "12": 3, "0012": 4}
    )
    params = body.engine_params(4, None)
    decoded = decode_request(encode_request(RequestMessage(id="c-1", prompt="x", params=params)))
    # "12" and "0012" name one token: the later one counts, as in vLLM's int(key)
    assert decoded.params["logit_bias"] == {7: 5, 0: -1, 12: 4}


# --- The published OpenAPI document states what the API does --------------------------------------------------

DOCUMENT = create_app(ApiSettings()).openapi()
COMPONENTS = DOCUMENT["components"]["schemas"]
# Their upper bound is the served model's context (max_tokens) or max_tokens itself (min_tokens).
MODEL_BOUNDED = {"max_tokens", "max_completion_tokens", "min_tokens"}


def _numbers(schema: dict, where: str):
    """(where, schema) of every integer or number schema inside `schema`, following $refs."""
    if "$ref" in schema:
        yield from _numbers(COMPONENTS[schema["$ref"].rsplit("/", 1)[1]], where)
        return
    if schema.get("type") in ("integer", "number"):
        yield where, schema
    for branch in schema.get("anyOf", []):
        yield from _numbers(branch, where)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _numbers(schema[key], f"{where}.{key}")


@pytest.mark.parametrize("model", ["ChatCompletionRequest", "CompletionRequest"])
def test_every_published_number_has_both_bounds(model):
    found = []
    for name, prop in COMPONENTS[model]["properties"].items():
        for where, schema in _numbers(prop, name):
            found.append(where)
            assert "minimum" in schema or "exclusiveMinimum" in schema, where
            if name in MODEL_BOUNDED:
                assert "max_tokens" in schema["description"] or "context" in schema["description"], where
            else:
                assert "maximum" in schema or "exclusiveMaximum" in schema, where
    assert {"temperature", "top_k", "seed", "logit_bias.additionalProperties", "stop_token_ids.items"} <= set(found)


def test_temperature_documents_the_greedy_rule():
    branch = COMPONENTS["ChatCompletionRequest"]["properties"]["temperature"]["anyOf"][0]
    assert "below 1e-05" in branch["description"] and "greedy" in branch["description"]


def _validator(model: str):
    text = json.dumps({**COMPONENTS[model], "$defs": COMPONENTS}).replace("#/components/schemas/", "#/$defs/")
    return jsonschema_rs.Draft202012Validator(json.loads(text))


CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
COMPLETION = {"model": "m", "prompt": "x"}
# (body, accepted): the document and the validation must give the same answer for each.
AGREEMENT = [
    (CHAT | {"max_tokens": 5.0}, True), (CHAT | {"max_tokens": 5.5}, False), (CHAT | {"n": True}, False),
    (CHAT | {"top_logprobs": 2}, False), (CHAT | {"top_logprobs": 2, "logprobs": True}, True),
    (CHAT | {"top_logprobs": None}, True), (CHAT | {"stream_options": {"include_usage": True}}, False),
    (CHAT | {"stream_options": {"include_usage": True}, "stream": True}, True),
    (CHAT | {"tools": [{"type": "function"}]}, False), (CHAT | {"tools": []}, True),
    (CHAT | {"tool_choice": "auto"}, True), (CHAT | {"response_format": {"type": "json_object"}}, True),
    (CHAT | {"response_format": {"type": "xml"}}, False), (CHAT | {"tool_choice": "any"}, False),
    (COMPLETION | {"tools": [{"type": "function", "function": {"name": "f"}}]}, False),
    (CHAT | {"tools": [{"type": "function", "function": {"name": "f"}}]}, True),
    (CHAT | {"messages": [{"role": "tool"}]}, False), (CHAT | {"messages": [{"role": "tool", "content": "1"}]}, True),
    (CHAT | {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "1", "function": {"name": "f", "arguments": "{}"}}]}]}, True),
    (CHAT | {"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "1", "function": {"name": "f", "arguments": "{}"}}]}]}, False),
    (CHAT | {"messages": [{"role": "assistant", "content": None, "tool_calls": []}]}, False),
    (CHAT | {"structured_outputs": {"choice": []}}, False), (CHAT | {"structured_outputs": {"choice": ["a"]}}, True),
    (CHAT | {"response_format": {"type": "text"}}, True), (CHAT | {"modalities": ["text", "audio"]}, False),
    (CHAT | {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}]}, False),
    (CHAT | {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, True),
    (CHAT | {"logit_bias": {"²": 1}}, False), (CHAT | {"logit_bias": {"٣": 1}}, False),
    (CHAT | {"logit_bias": {"007": 1}}, True), (CHAT | {"logit_bias": {"7": 100.0}}, True),
    (CHAT | {"seed": 2**63 - 1}, True), (CHAT | {"seed": 2**63}, False), (CHAT | {"top_k": 2**31 - 1}, True),
    (CHAT | {"top_k": 2**31}, False), (CHAT | {"repetition_penalty": 0.01}, True),
    (CHAT | {"repetition_penalty": 0.0099}, False), (CHAT | {"temperature": 5e-324}, True),
    (CHAT | {"temperature": -0.0}, True), (CHAT | {"top_p": 0.0}, False), (CHAT | {"top_p": 5e-324}, True),
    (COMPLETION | {"best_of": 3}, False), (COMPLETION | {"best_of": 3, "n": 3}, True),
    (COMPLETION | {"best_of": 1}, True), (COMPLETION | {"best_of": 1, "n": 2}, False),
    (COMPLETION | {"best_of": None, "n": 5}, True), (COMPLETION | {"echo": True}, True),
    (COMPLETION | {"max_tokens": 0}, True), (COMPLETION | {"max_tokens": 0, "echo": True}, True),
    (COMPLETION | {"max_tokens": 0.0, "echo": True}, True), (COMPLETION | {"max_tokens": -1, "echo": True}, False),
    (COMPLETION | {"echo": False}, True), (COMPLETION | {"suffix": "x"}, False), (COMPLETION | {"suffix": ""}, True),
    (COMPLETION | {"prompt": [1.0, 2.0]}, True), (COMPLETION | {"prompt": [2**31]}, False),
    (COMPLETION | {"stream_options": {}, "stream": False}, False),
]  # fmt: skip


@pytest.mark.parametrize(("body", "accepted"), AGREEMENT, ids=[json.dumps(b)[-60:] for b, _ in AGREEMENT])
def test_the_published_document_and_the_validation_agree(body, accepted):
    model = ChatCompletionRequest if "messages" in body else CompletionRequest
    assert _validator(model.__name__).is_valid(body) is accepted
    try:
        model(**body)
    except ValidationError:
        assert not accepted
    else:
        assert accepted


def test_every_route_documents_400_not_fastapis_422():
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            if operation.get("parameters") or operation.get("requestBody"):
                assert "400" in responses, (method, path)
            if "422" in responses:  # only the real one: an Idempotency-Key reused with another body
                assert "Idempotency-Key" in responses["422"]["description"], (method, path)
    assert "HTTPValidationError" not in COMPONENTS
    cancel = DOCUMENT["paths"]["/v1/requests/{request_id}/cancel"]["post"]["responses"]
    assert set(cancel) == {"200", "400", "401", "404"}
