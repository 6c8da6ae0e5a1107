"""Which parser reads a request's output: the forced forms by tool_choice, `auto` by the model's format."""

from __future__ import annotations

from api.tool_parsers import ToolCallParser
from api.tool_parsers.forced import NamedArgumentsParser, RequiredArrayParser
from api.tool_parsers.hermes import OPEN, HermesParser
from api.tool_parsers.llama3_json import PYTHON_TAG, Llama3JsonParser

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
PARSER_NAMES = (HERMES, LLAMA3_JSON)


def parser_for_template(chat_template: str) -> str:
    """The tool call format a chat template teaches its model: `<tool_call>` tags are Hermes' (Qwen);
    `<|python_tag|>`, or calls written as {"name", "parameters"}, are Llama 3's; anything else gets
    Hermes', the format most open models were tuned on."""
    if OPEN in chat_template:
        return HERMES
    if PYTHON_TAG in chat_template or '"parameters"' in chat_template:
        return LLAMA3_JSON
    return HERMES


def make_parser(mode: str, parser: str, function_name: str) -> ToolCallParser:
    """The parser of a tool mode (api/tool_request.py's REQUIRED, NAMED, AUTO) and, for AUTO, format."""
    if mode == "required":
        return RequiredArrayParser()
    if mode == "named":
        return NamedArgumentsParser(function_name)
    if parser == LLAMA3_JSON:
        return Llama3JsonParser()
    if parser == HERMES:
        return HermesParser()
    raise ValueError(f"unknown tool parser {parser!r}; known: {', '.join(PARSER_NAMES)}")
