"""Structured output and tool calls end to end: the API and a real `python -m worker` serving the packaged
SmolLM2 on CPU, greedy, requests sent concurrently so the worker batches constrained and unconstrained
sequences together.

- 50 JSON Schemas of increasing difficulty (tests/api/structured_schemas.py), each whole and streamed,
  through chat's response_format and completions' structured_outputs: every output validates under its
  schema with `jsonschema` (formats checked too), 100 requests at once;
- regexes and choices, through completions and chat, whole and streamed;
- the openai SDK: tools with a named, a required and an auto tool_choice, whole and streamed (deltas
  assembled by the SDK's stream helper), and response_format from a pydantic model (`parse`);
- a grammar the worker cannot compile: a 400 naming the field, whole and streamed.
"""

from __future__ import annotations

import json
import re
import secrets
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel, Field

from api.settings import ApiSettings
from tests.api.processes import SERVED, WorkerProcess
from tests.api.servers import API_KEY, ThreadApi
from tests.api.structured_schemas import SCHEMAS
from tests.api.wire import assert_envelope, chunks, parse_sse

MAX_TOKENS = 160
GREEDY = {"temperature": 0.0, "seed": 7}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}  # fmt: skip
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
                   "required": ["zone"], "additionalProperties": False}}}  # fmt: skip
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory):
    from engine.config import ModelConfig
    from engine.model_loader import resolve_model_dir

    resolve_model_dir(ModelConfig(model="default"))
    prefix = f"so{secrets.token_hex(4)}"
    client = redis_server.client(decode_responses=True)
    worker = WorkerProcess(
        redis_server, prefix, tmp_path_factory.mktemp("structured") / "worker.log",
        extra_args=("--num-kv-tokens", "12288"),
    )  # fmt: skip
    try:
        worker.wait_ready(client, prefix)
        api = ThreadApi(ApiSettings(redis_url=redis_server.url, prefix=prefix, api_keys=[API_KEY])).start()
        try:
            yield api
        finally:
            api.stop()
    finally:
        worker.stop()
        client.close()


def _whole(api: ThreadApi, url: str, body: dict) -> tuple[str, str]:
    with api.client(timeout=300) as client:
        response = client.post(url, json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return (choice["message"]["content"] if "message" in choice else choice["text"]), choice["finish_reason"]


def _streamed(api: ThreadApi, url: str, body: dict) -> tuple[str, str]:
    with api.client(timeout=300) as client:
        response = client.post(url, json=body | {"stream": True})
    assert response.status_code == 200, response.text
    parts, finish = [], None
    for chunk in chunks(parse_sse(response.text)):
        assert "error" not in chunk, chunk
        choice = chunk["choices"][0]
        parts.append(choice["delta"].get("content") or "" if "delta" in choice else choice["text"])
        finish = choice["finish_reason"] or finish
    return "".join(parts), finish


def _schema_request(index: int, schema: dict, stream: bool) -> tuple[str, dict]:
    """Each schema twice, once whole and once streamed: through chat's response_format and completions'
    structured_outputs, the endpoints alternating by schema."""
    if (index + stream) % 2 == 0:
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": schema}}
        body = {"model": SERVED, "max_tokens": MAX_TOKENS, **GREEDY, "response_format": fmt,
                "messages": [{"role": "user", "content": "Answer with JSON that fits the schema."}]}  # fmt: skip
        return "/v1/chat/completions", body
    body = {"model": SERVED, "max_tokens": MAX_TOKENS, **GREEDY, "prompt": "A JSON value:",
            "structured_outputs": {"json": schema}}  # fmt: skip
    return "/v1/completions", body


def test_fifty_json_schemas_all_validate_whole_and_streamed(served):
    def run(job: tuple[int, bool]) -> tuple[int, bool, str, str]:
        index, stream = job
        url, body = _schema_request(index, SCHEMAS[index], stream)
        return index, stream, *(_streamed if stream else _whole)(served, url, body)

    jobs = [(index, stream) for index in range(len(SCHEMAS)) for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    failures = []
    for index, stream, output, finish in results:
        try:
            assert finish == "stop", f"finish_reason {finish}"
            jsonschema.validate(json.loads(output), SCHEMAS[index], format_checker=jsonschema.FormatChecker())
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"schema {index} ({'streamed' if stream else 'whole'}): {output!r}: {str(exc)[:200]}")
    assert not failures, "\n".join(failures)


REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no)", r"[A-Z][a-z]{2,8}", r"^#[0-9a-f]{6}$", r"(ab|cd){2,3}x?"]
CHOICES = [["red", "green", "blue"], ["Paris", "London", "Rome"], ["positive", "negative", "neutral"]]


def test_regexes_and_choices_through_completions_and_chat_whole_and_streamed(served):
    cases = []
    for i, pattern in enumerate(REGEXES):
        cases.append(("regex", pattern, i))
    for i, options in enumerate(CHOICES):
        cases.append(("choice", options, i))

    def run(case: tuple) -> tuple[tuple, str, str]:
        kind, value, i = case
        constraint = {"structured_outputs": {kind: value}} if i % 2 else {f"guided_{kind}": value}
        if i % 2:
            body = {"model": SERVED, "max_tokens": 24, **GREEDY, "prompt": "Answer:", **constraint}
            url = "/v1/completions"
        else:
            body = {"model": SERVED, "max_tokens": 24, **GREEDY, "messages": [{"role": "user", "content": "Answer."}],
                    **constraint}  # fmt: skip
            url = "/v1/chat/completions"
        read = _streamed if i % 3 == 0 else _whole
        return case, *read(served, url, body)

    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(run, cases))
    for (kind, value, _), output, finish in results:
        assert finish == "stop", (value, output, finish)
        if kind == "regex":
            assert re.fullmatch(value.removeprefix("^").removesuffix("$"), output), (value, output)
        else:
            assert output in value, (value, output)


def _client(api: ThreadApi) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _check_calls(calls, allowed: set[str]) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        schema = TOOLS[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_openai_sdk_named_and_required_tool_choice_whole_and_streamed(served):
    client = _client(served)
    named = {"type": "function", "function": {"name": "get_weather"}}
    common = {"model": SERVED, "messages": QUESTION, "tools": [WEATHER, TIME], "max_tokens": 80, **GREEDY}

    def whole(tool_choice):
        return client.chat.completions.create(**common, tool_choice=tool_choice)

    def streamed(tool_choice):
        with client.chat.completions.stream(**common, tool_choice=tool_choice) as stream:
            return stream.get_final_completion()

    jobs = [(whole, named), (streamed, named), (whole, "required"), (streamed, "required")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: job[0](job[1]), jobs))
    for (_, choice), answer in zip(jobs, answers, strict=True):
        message = answer.choices[0].message
        assert answer.choices[0].finish_reason == "tool_calls", answer
        if choice == "required":
            _check_calls(message.tool_calls, {"get_weather", "get_time"})
        else:
            _check_calls(message.tool_calls, {"get_weather"})
            assert len(message.tool_calls) == 1
    single = client.chat.completions.create(**common, tool_choice="required", parallel_tool_calls=False)
    assert len(single.choices[0].message.tool_calls) == 1

    # The calls go back as the conversation's next turns; the model answers in text.
    call = answers[0].choices[0].message.tool_calls[0]
    follow = client.chat.completions.create(
        model=SERVED, max_tokens=16, **GREEDY, tools=[WEATHER, TIME], tool_choice="none",
        messages=[*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}],
    )  # fmt: skip
    assert follow.choices[0].message.tool_calls is None and follow.choices[0].message.content


def test_openai_sdk_auto_tool_choice_is_well_formed_either_way(served):
    client = _client(served)
    common = {"model": SERVED, "messages": QUESTION, "tools": [WEATHER, TIME], "max_tokens": 48, **GREEDY}
    whole = client.chat.completions.create(**common)
    # NOTE: the SDK's stream() helper raises on finish_reason "length", which a free answer may reach; its
    # chunk assembler (what stream() runs) reads the chunks of a plain streamed create(), and its snapshot is
    # the assembled answer.
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(**common, stream=True):
        state.handle_chunk(chunk)
    streamed = state.current_completion_snapshot
    for answer in (whole, streamed):
        choice = answer.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            _check_calls(choice.message.tool_calls, {"get_weather", "get_time"})
        else:
            assert choice.finish_reason in ("stop", "length") and choice.message.content
    assert whole.choices[0].message.content == streamed.choices[0].message.content


class Forecast(BaseModel):
    city: str = Field(max_length=16)
    celsius: int = Field(ge=-30, le=50)
    sunny: bool


def test_openai_sdk_parse_with_a_pydantic_model(served):
    client = _client(served)
    answer = client.chat.completions.parse(
        model=SERVED, messages=QUESTION, response_format=Forecast, max_tokens=80, **GREEDY
    )
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Forecast), answer


def test_a_grammar_the_worker_cannot_compile_is_400_whole_and_streamed(served):
    body = {"model": SERVED, "prompt": "x", "max_tokens": 4, "structured_outputs": {"grammar": "root ::= missing"}}
    with served.client(timeout=60) as client:
        for stream in (False, True):
            error = assert_envelope(client.post("/v1/completions", json=body | {"stream": stream}), 400)
            assert error["param"] == "structured_outputs.grammar" and error["code"] == "invalid_constraint", error
