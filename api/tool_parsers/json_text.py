"""Finding where a JSON value ends in text that may still be growing, and reading a call out of it."""

from __future__ import annotations

import json
from typing import Any

from api.tool_parsers import ToolCall


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON object or array opening at `start`, or None while it is unfinished.

    Tracks strings and escapes, so braces inside strings do not count; the text is parsed with `json`
    once it is complete (this only finds where to cut)."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def call_of(value: Any, argument_keys: tuple[str, ...]) -> ToolCall | None:
    """A ToolCall from a decoded {"name": str, <argument key>: object}, or None when it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in value:
            arguments = value[key]
            break
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def call_of_text(text: str, argument_keys: tuple[str, ...]) -> ToolCall | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return call_of(value, argument_keys)
