"""Tool call parsers: whole outputs, the same outputs streamed in every two-way cut and in random
chunkings (a stream must assemble to exactly the whole answer), and malformed calls left as content."""

from __future__ import annotations

import json
import random

import pytest

from api.tool_parsers import ArgumentsFragment, ToolCall, parse_whole
from api.tool_parsers.forced import NamedArgumentsParser, RequiredArrayParser
from api.tool_parsers.registry import HERMES, LLAMA3_JSON, make_parser, parser_for_template

WEATHER = ToolCall("get_weather", '{"city": "Paris", "unit": "celsius"}')
TIME = ToolCall("get_time", '{"zone": "UTC}{"}')

# (parser, output, expected pieces after merging adjacent content)
CASES = [
    (HERMES, "plain answer, no call", ["plain answer, no call"]),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     [WEATHER]),
    (HERMES, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
     '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC}{"}}\n</tool_call>\n',
     ["Let me check.\n", WEATHER, TIME]),
    # arguments as JSON text, and "parameters" for "arguments"
    (HERMES, '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC}{\\"}"}</tool_call>', [TIME]),
    (HERMES, '<tool_call>{"name": "get_time", "parameters": {"zone": "UTC}{"}}</tool_call>', [TIME]),
    # the output ended before the closing tag: a complete call is still a call
    (HERMES, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC}{"}}\n', [TIME]),
    # malformed: left as content, unchanged
    (HERMES, "<tool_call>{not json}</tool_call> done", ["<tool_call>{not json}</tool_call> done"]),
    (HERMES, '<tool_call>{"arguments": {}}</tool_call>', ['<tool_call>{"arguments": {}}</tool_call>']),
    (HERMES, '<tool_call>{"name": "f", "arguments": [1]}', ['<tool_call>{"name": "f", "arguments": [1]}']),
    (HERMES, "a <tool_ca", ["a <tool_ca"]),
    (HERMES, "x < y and <b>tags</b>", ["x < y and <b>tags</b>"]),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', [WEATHER]),
    (LLAMA3_JSON, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
     '{"name": "get_time", "parameters": {"zone": "UTC}{"}}', [WEATHER, TIME]),
    (LLAMA3_JSON, ' \n{"name": "get_time", "arguments": {"zone": "UTC}{"}};\n', [TIME]),
    (LLAMA3_JSON, "The weather is fine.", ["The weather is fine."]),
    (LLAMA3_JSON, '{"answer": 42}', ['{"answer": 42}']),
    (LLAMA3_JSON, '{"name": "get_time", "parameters": {"zone": ', ['{"name": "get_time", "parameters": {"zone": ']),
    (LLAMA3_JSON, "<|python", ["<|python"]),
]  # fmt: skip


def merged(pieces: list) -> list:
    out: list = []
    for piece in pieces:
        if isinstance(piece, str) and out and isinstance(out[-1], str):
            out[-1] += piece
        elif piece != "":
            out.append(piece)
    return out


def streamed(name: str, chunks: list[str]) -> list:
    parser = make_parser("auto", name, "")
    pieces = [piece for chunk in chunks for piece in parser.feed(chunk)]
    return merged(pieces + parser.close())


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole_output(name, text, expected):
    assert merged(parse_whole(make_parser("auto", name, ""), text)) == expected


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_two_way_cut_and_random_chunkings_give_the_whole_output(name, text, expected):
    for cut in range(len(text) + 1):
        assert streamed(name, [text[:cut], text[cut:]]) == expected, cut
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 12))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(name, chunks) == expected, chunks
    assert streamed(name, list(text)) == expected  # one character at a time


def test_content_is_released_as_soon_as_it_cannot_start_a_call():
    parser = make_parser("auto", HERMES, "")
    assert parser.feed("Hello <") == ["Hello "]
    assert parser.feed("b>") == ["<b>"]
    assert parser.feed("<tool_call>{") == []
    llama = make_parser("auto", LLAMA3_JSON, "")
    assert llama.feed(" ") == [] and llama.feed("Sure") == [" Sure"]


def test_required_array_gives_each_item_as_a_call_once_it_closes():
    parser = RequiredArrayParser()
    text = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}, ' \
        '{"name": "get_time", "parameters": {"zone": "UTC}{"}}]'  # fmt: skip
    cut = text.index(", {")
    assert parser.feed(text[: cut - 1]) == []
    assert parser.feed(text[cut - 1 : cut + 5]) == [WEATHER]
    assert parser.feed(text[cut + 5 :]) == [TIME]
    assert parser.close() == []
    for size in (1, 3, 7):
        p = RequiredArrayParser()
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        assert merged([x for c in chunks for x in p.feed(c)] + p.close()) == [WEATHER, TIME]
    cut_short = ' [{"name": "get_time", "parameters": {"zo'  # max_tokens ended it: content, as it came
    assert parse_whole(RequiredArrayParser(), cut_short) == [cut_short]


def test_named_choice_streams_the_arguments_as_they_come():
    parser = NamedArgumentsParser("get_time")
    assert parser.feed('{"zone"') == [ToolCall("get_time", '{"zone"')]
    assert parser.feed(': "UTC"}') == [ArgumentsFragment(': "UTC"}')]
    assert parser.feed("") == [] and parser.close() == []
    assert parse_whole(NamedArgumentsParser("f"), "") == [ToolCall("f", "")]


@pytest.mark.parametrize(
    ("template", "parser"),
    [("{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}", HERMES),
     ("<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}", LLAMA3_JSON),
     ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}',
      LLAMA3_JSON),
     ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}", HERMES)],
    ids=["qwen-tags", "llama-python-tag", "llama-parameters", "no-tools"],
)  # fmt: skip
def test_parser_is_picked_from_the_chat_template(template, parser):
    assert parser_for_template(template) == parser


def test_arguments_are_json_text_of_an_object():
    (call,) = parse_whole(make_parser("auto", HERMES, ""), '<tool_call>{"name": "f", "arguments": {"ü": [1, 2.5]}}')
    assert json.loads(call.arguments) == {"ü": [1, 2.5]}
