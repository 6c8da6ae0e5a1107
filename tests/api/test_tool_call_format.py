"""Tool calls in responses: the chunks of a streamed answer, assembled by the openai SDK's own stream
state, equal the whole answer, for every tool_choice mode and however the worker cut the text."""

from __future__ import annotations

import json
import random

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from api.logprob_format import token_texts
from api.openai_format import ChunkFormatter, WholeResponse
from api.request_meta import CHAT, RequestMeta
from worker.protocol import ResultEvent

WEATHER = '{"city": "Paris"}'
OUTPUTS = {
    ("auto", "hermes"): (f'Checking.<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
                         "Checking.", [("get_weather", WEATHER)]),
    ("auto", "llama3_json"): (f'{{"name": "get_weather", "parameters": {WEATHER}}}; {{"name": "get_time", '
                              '"parameters": {}}', None, [("get_weather", WEATHER), ("get_time", "{}")]),
    ("required", ""): (f'[{{"name": "get_weather", "parameters": {WEATHER}}}]', None, [("get_weather", WEATHER)]),
    ("named", ""): (WEATHER, None, [("get_weather", WEATHER)]),
    ("auto", "hermes-text"): ("It is sunny.", "It is sunny.", []),
    ("none", ""): ('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
                   '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', []),
}  # fmt: skip


def meta(mode: str, parser: str, n: int = 1) -> RequestMeta:
    return RequestMeta(
        request_id="chatcmpl-7", owner="o", kind=CHAT, model="m", created=1, n=n, include_usage=False, logprobs=None,
        prompt_tokens=3, result_stream="r", tool_mode=mode, tool_parser=parser.removesuffix("-text"),
        tool_name="get_weather" if mode == "named" else "",
    )  # fmt: skip


def events(text: str, pieces: int, seed: int, n: int = 1) -> list[ResultEvent]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(pieces - 1, len(text) - 1)))
    out, seq = [], 0
    for index in range(n):
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            seq += 1
            out.append(ResultEvent(seq=seq, type="token", index=index, text=text[a:b], token_ids=[1]))
        seq += 1
        usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
        out.append(ResultEvent(seq=seq, type="done", index=index, finish_reason="stop", usage=usage))
    return out


@pytest.mark.parametrize(("mode", "parser"), list(OUTPUTS), ids=["-".join(k).strip("-") for k in OUTPUTS])
@pytest.mark.parametrize("pieces", [1, 3, 17, 1000])
def test_streamed_tool_calls_assemble_to_the_whole_answer(mode, parser, pieces):
    text, content, calls = OUTPUTS[(mode, parser)]
    request = meta(mode, parser, n=2)
    stream = events(text, pieces, seed=pieces, n=2)
    whole = WholeResponse(request, token_texts(None))
    formatter = ChunkFormatter(request, token_texts(None))
    state = ChatCompletionStreamState()
    for event in stream:
        whole.add(event)
        state.handle_chunk(ChatCompletionChunk.model_validate(formatter.chunk(event)))
    body = whole.body()
    assembled = state.get_final_completion()
    for index in range(2):
        message = body["choices"][index]["message"]
        assert message["content"] == content
        got = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert got == calls
        for name, arguments in calls:
            assert isinstance(json.loads(arguments), dict), name
        finish = "tool_calls" if calls else "stop"
        assert body["choices"][index]["finish_reason"] == finish
        sdk = assembled.choices[index]
        assert sdk.finish_reason == finish
        assert (sdk.message.content or None) == content
        sdk_calls = [(c.function.name, c.function.arguments) for c in sdk.message.tool_calls or []]
        assert sdk_calls == calls
        ids = [c["id"] for c in message.get("tool_calls", [])]
        assert ids == [c.id for c in sdk.message.tool_calls or []]
        assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)


def test_call_ids_are_the_same_on_a_replay():
    """A resumed stream replays the events through a new formatter: the ids must not change."""
    text = OUTPUTS[("required", "")][0]
    first = [ChunkFormatter(meta("required", ""), token_texts(None)).chunk(e) for e in events(text, 4, 1)]
    again = [ChunkFormatter(meta("required", ""), token_texts(None)).chunk(e) for e in events(text, 4, 1)]
    assert first == again


def test_length_cut_keeps_finish_reason_length_and_the_text_as_content():
    text = '[{"name": "get_weather", "parameters": {"ci'
    whole = WholeResponse(meta("required", ""), token_texts(None))
    for event in events(text, 3, 0):
        if event.type == "done":
            event.finish_reason = "length"
        whole.add(event)
    choice = whole.body()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": text}


def test_the_api_renders_tools_as_the_worker_does():
    """The prompt count of a request with tools: the API's Jinja rendering against transformers' (the worker's)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from api.tokens import PromptTokenizer

    template = (
        "{{ (tools is defined)|string }}|{{ (tools is none)|string }}|{% for t in tools or [] %}{{ t.function.name }}"
        "{{ t.function.parameters | tojson }}{% endfor %}|{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}"
    )
    backend = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    worker = PreTrainedTokenizerFast(tokenizer_object=backend)
    worker.chat_template = template
    api = PromptTokenizer.from_fields({"tokenizer_json": backend.to_str(), "chat_template": template})
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]  # fmt: skip
    for given in (None, tools):
        expected = worker.apply_chat_template(messages, tools=given, tokenize=False, add_generation_prompt=True)
        assert api.render_chat(messages, given) == expected


def test_the_auto_parser_comes_from_the_template_unless_the_setting_names_one():
    from tokenizers import Tokenizer, models

    from api.output_plan import plan_output
    from api.schemas import ChatCompletionRequest
    from api.settings import ApiSettings
    from api.tokens import PromptTokenizer

    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}],
        tools=[{"type": "function", "function": {"name": "f"}}],
    )  # fmt: skip
    backend = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).to_str()
    llama = PromptTokenizer.from_fields({"tokenizer_json": backend, "chat_template": "{{ '<|python_tag|>' }}"})
    qwen = PromptTokenizer.from_fields({"tokenizer_json": backend, "chat_template": "<tool_call>{{ tools }}"})
    assert plan_output(body, llama, ApiSettings()).meta_fields()["tool_parser"] == "llama3_json"
    assert plan_output(body, qwen, ApiSettings()).meta_fields()["tool_parser"] == "hermes"
    assert plan_output(body, None, ApiSettings()).meta_fields()["tool_parser"] == "hermes"
    forced = ApiSettings(tool_parser="llama3_json")
    assert plan_output(body, qwen, forced).meta_fields() == {
        "constraint_field": "", "tool_mode": "auto", "tool_parser": "llama3_json", "tool_name": "",
    }  # fmt: skip
