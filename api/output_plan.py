"""What a request asks of its output beyond sampling: the structured output constraint the worker enforces,
the tools its chat template renders, and how the API reads the output back (plain text or tool calls).

Planned once, before the prompt is counted (the tools are part of the rendered prompt) and before anything
is enqueued: every refusal here is a 400 with nothing written to Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.errors import bad_request
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.settings import ApiSettings
from api.structured_output import INVALID_CONSTRAINT, single_constraint
from api.tokens import PromptTokenizer
from api.tool_parsers.registry import HERMES, parser_for_template
from api.tool_request import AUTO, ToolPlan, plan_tools


@dataclass(frozen=True)
class OutputPlan:
    constraint: dict[str, Any] | None = None  # params.structured_output
    constraint_field: str = ""  # the request field that asked for it
    tools: ToolPlan | None = None
    tool_parser: str = ""  # the format tool_choice "auto" reads

    def meta_fields(self) -> dict[str, Any]:
        """RequestMeta's fields for formatting the output on any replica."""
        if self.tools is None:
            return {"constraint_field": self.constraint_field}
        return {
            "constraint_field": self.constraint_field,
            "tool_mode": self.tools.mode,
            "tool_parser": self.tool_parser,
            "tool_name": self.tools.function_name,
        }

    def message_fields(self) -> dict[str, Any]:
        """The request message's fields for the tools (the chat template renders them)."""
        return {"tools": self.tools.tools} if self.tools is not None else {}


NO_PLAN = OutputPlan()
_CONSTRAINT_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def asks_for_output_checks(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether `plan_output` has schemas or regexes to check (a large schema takes milliseconds: off the loop)."""
    fmt = body.response_format
    if (fmt is not None and fmt.type != "text") or any(getattr(body, name) is not None for name in _CONSTRAINT_FIELDS):
        return True
    return isinstance(body, ChatCompletionRequest) and (bool(body.tools) or body.tool_choice not in (None, "none"))


def plan_output(
    body: ChatCompletionRequest | CompletionRequest, tokenizer: PromptTokenizer | None, settings: ApiSettings
) -> OutputPlan:
    found = body.requested_constraints()
    tools: ToolPlan | None = None
    if isinstance(body, ChatCompletionRequest):
        tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    if tools is not None and tools.constraint is not None and found:
        field = found[0][0]
        raise bad_request(
            f"{field}: tool_choice {tools.mode!r} constrains the output already; drop one of them",
            param=field,
            code=INVALID_CONSTRAINT,
        )
    chosen = single_constraint(found)
    if chosen is None and tools is not None and tools.constraint is not None:
        chosen = ("tool_choice", tools.constraint)
    field, constraint = chosen if chosen is not None else ("", None)
    if tools is None:
        return OutputPlan(constraint, field) if constraint is not None else NO_PLAN
    parser = ""
    if tools.mode == AUTO:
        parser = settings.tool_parser or (parser_for_template(tokenizer.chat_template) if tokenizer else HERMES)
    return OutputPlan(constraint, field, tools, parser)
