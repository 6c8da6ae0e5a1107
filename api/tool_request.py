"""OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` on a chat request: what the worker's chat
template renders, the constraint a forced choice sends, and how the output is read back
(docs/decisions/0060-tool-calling.md).

    tool_choice    template gets tools   constraint                       output read as
    none           yes                   none                             text (never parsed)
    auto           yes                   none                             the model's format (api/tool_parsers/)
    required       yes                   JSON array of {name, parameters}  that array, each item a call
    {function}     yes                   that function's parameters        one call, the output its arguments

`auto` is the default when tools are given, `none` when they are not (as OpenAI has it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from api.constraint_checks import check_json_schema
from api.errors import bad_request
from api.structured_output import INVALID_CONSTRAINT, checked_constraint

UNKNOWN_TOOL = "unknown_tool"
INVALID_TOOLS = "invalid_tools"
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
# A function without `parameters` takes none (OpenAI's reading).
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

# Modes, as RequestMeta.tool_mode stores them ("" is no tool handling at all).
NONE, AUTO, REQUIRED, NAMED = "none", "auto", "required", "named"


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[StrictStr, Field(pattern=FUNCTION_NAME)]
    description: Annotated[StrictStr, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema object; absent: no parameters.")
    strict: StrictBool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)]


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools ask of the worker and of the output formatting."""

    mode: str  # NONE, AUTO, REQUIRED or NAMED
    tools: list[dict[str, Any]]  # as the chat template gets them
    constraint: dict[str, Any] | None  # params.structured_output for REQUIRED and NAMED
    function_name: str = ""  # NAMED: the function the output is the arguments of


def plan_tools(
    tools: list[Tool] | None, tool_choice: str | NamedToolChoice | None, parallel_tool_calls: bool
) -> ToolPlan | None:
    """The request's ToolPlan (None without tools), every tool's parameters checked."""
    if not tools:
        if tool_choice is not None and tool_choice != NONE:
            raise bad_request(
                "tool_choice: only 'none' is allowed when no tools are given", param="tool_choice",
                code=INVALID_TOOLS,
            )  # fmt: skip
        return None
    names: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in names:
            raise bad_request(
                f"tools[{i}].function.name: {name!r} is also the name of tools[{names[name]}]",
                param=f"tools[{i}].function.name",
                code=INVALID_TOOLS,
            )
        names[name] = i
        if tool.function.parameters is not None:
            _check_parameters(tool.function.parameters, f"tools[{i}].function.parameters")
    wire = [tool.model_dump(exclude_none=True) for tool in tools]
    if tool_choice is None or tool_choice == AUTO:
        return ToolPlan(AUTO, wire, None)
    if tool_choice == NONE:
        return ToolPlan(NONE, wire, None)
    if tool_choice == REQUIRED:
        schema = required_schema(tools, parallel_tool_calls)
        return ToolPlan(REQUIRED, wire, checked_constraint("tools", {"json": schema}))
    assert isinstance(tool_choice, NamedToolChoice)
    name = tool_choice.function.name
    if name not in names:
        raise bad_request(
            f"tool_choice.function.name: {name!r} is not one of the tools ({', '.join(names)})",
            param="tool_choice.function.name",
            code=UNKNOWN_TOOL,
        )
    index = names[name]
    field = f"tools[{index}].function.parameters"
    return ToolPlan(NAMED, wire, checked_constraint(field, {"json": parameters_of(tools[index])}), name)


def _check_parameters(schema: dict[str, Any], field: str) -> None:
    try:
        check_json_schema(schema, field)
    except ValueError as exc:
        param = getattr(exc, "param", field)
        raise bad_request(f"{param}: {getattr(exc, 'message', exc)}", param=param, code=INVALID_CONSTRAINT) from None


def parameters_of(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters if tool.function.parameters is not None else NO_PARAMETERS


def required_schema(tools: list[Tool], parallel_tool_calls: bool) -> dict[str, Any]:
    """A JSON array of at least one call {name, parameters}, each of one of the tools (vLLM's form: the
    constraint fixes the format, so it works with any model's chat template)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.function.name}, "parameters": parameters_of(tool)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    schema["minItems"] = 1
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def wire_tool_calls(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's tool_calls as chat templates read them: `arguments` as an object where it is
    JSON text of one (templates write `arguments | tojson`), as vLLM and transformers pass them."""
    out = []
    for call in tool_calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                function["arguments"] = parsed
        out.append({**call, "function": function})
    return out
