"""The request message's structured output and tools: `params.structured_output` (one constraint) and `tools`
(OpenAI tool objects for the chat template), checked on decode with errors that name the field."""

from __future__ import annotations

import json
from typing import Any

from worker.protocol.names import ProtocolError
from worker.protocol.sampling_limits import (
    MAX_CHOICE_CHARS,
    MAX_CHOICES,
    MAX_STRUCTURED_OUTPUT_CHARS,
    MAX_TOOLS,
    STRUCTURED_OUTPUT_KINDS,
)


def check_structured_output(value: Any) -> None:
    """Raises ProtocolError naming `params.structured_output[.<kind>]` unless value is one constraint."""
    field = "params.structured_output"
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in STRUCTURED_OUTPUT_KINDS:
        raise ProtocolError(field, f"must be an object with exactly one of {list(STRUCTURED_OUTPUT_KINDS)}")
    kind, body = next(iter(value.items()))
    field = f"{field}.{kind}"
    size = len(json.dumps(body, ensure_ascii=False))
    if size > MAX_STRUCTURED_OUTPUT_CHARS:
        raise ProtocolError(field, f"may be at most {MAX_STRUCTURED_OUTPUT_CHARS} characters of JSON, got {size}")
    if kind == "json" and not isinstance(body, dict):
        raise ProtocolError(field, f"must be a JSON Schema object, got {type(body).__name__}")
    if kind == "json_object" and body is not True:
        raise ProtocolError(field, f"must be true, got {str(body)[:40]!r}")
    if kind in ("regex", "grammar") and (not isinstance(body, str) or not body.strip()):
        raise ProtocolError(field, "must be a non-empty string")
    if kind == "choice":
        if not isinstance(body, list) or not 1 <= len(body) <= MAX_CHOICES:
            raise ProtocolError(field, f"must be a list of 1 to {MAX_CHOICES} strings")
        for i, choice in enumerate(body):
            if not isinstance(choice, str) or not 1 <= len(choice) <= MAX_CHOICE_CHARS:
                raise ProtocolError(f"{field}[{i}]", f"must be a string of 1 to {MAX_CHOICE_CHARS} characters")


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """A list of at most MAX_TOOLS `{"type": "function", "function": {"name", "description"?, "parameters"?}}`."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ProtocolError("tools", f"must be a JSON list of at most {MAX_TOOLS} tool objects")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ProtocolError(f"tools[{i}]", 'must be {"type": "function", "function": {...}}')
        function = tool["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ProtocolError(f"tools[{i}].function.name", "must be a non-empty string")
        if not isinstance(function.get("description", ""), str):
            raise ProtocolError(f"tools[{i}].function.description", "must be a string")
        if not isinstance(function.get("parameters", {}), dict):
            raise ProtocolError(f"tools[{i}].function.parameters", "must be a JSON Schema object")
    return tools
