"""A chat request's messages as clients send them: text or text parts, an earlier assistant turn's tool calls,
a tool's answer; checked here and turned into the protocol's message dicts (`ChatMessage.wire`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from api.errors import FieldError
from api.field_types import MAX_TOOLS
from api.tool_request import wire_tool_calls


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    arguments: StrictStr


class MessageToolCall(BaseModel):
    """A tool call of an earlier assistant turn, as the client sends it back."""

    model_config = ConfigDict(extra="ignore")
    id: Annotated[StrictStr, Field(max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction


def _publish_message_rules(schema: dict[str, Any]) -> None:
    """JSON Schema of the rules `ChatMessage._content_or_calls` checks: content is required but on an assistant
    message with tool calls, and only assistant messages carry tool calls."""
    no_calls = {"properties": {"tool_calls": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}}}
    assistant = {"properties": {"role": {"const": "assistant"}}, "required": ["role"]}
    with_calls = {"properties": {"tool_calls": {"type": "array", "minItems": 1}}, "required": ["tool_calls"]}
    content = {"properties": {"content": {"not": {"type": "null"}}}, "required": ["content"]}
    schema["allOf"] = [{"anyOf": [no_calls, assistant]}, {"anyOf": [content, {"allOf": [assistant, with_calls]}]}]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", json_schema_extra=_publish_message_rules)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[TextPart], Field(min_length=1)] | None = Field(
        None, description="Required except on an assistant message with tool_calls."
    )
    name: Annotated[StrictStr, Field(max_length=256)] | None = None
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=MAX_TOOLS)] | None = Field(
        None, description="Assistant messages only."
    )
    tool_call_id: Annotated[StrictStr, Field(max_length=256)] | None = Field(None, description="Tool messages only.")

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("role") == "function":
                raise FieldError("role", "role 'function' is not supported (use tools and role 'tool')")
            content = data.get("content")
            if isinstance(content, list):
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind is not None and kind != "text":
                        raise FieldError("content", f"content parts of type {kind!r} are not supported, only 'text'")
        return data

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise FieldError("tool_calls", "only assistant messages carry tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise FieldError("content", "required (only an assistant message with tool_calls may leave it out)")
        return self

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def wire(self) -> dict[str, Any]:
        """The message as the protocol carries it. OpenAI's "developer" role is what open models'
        templates call "system"."""
        # NOTE: an assistant turn of tool calls alone has content null; the template gets "" (as falsy as None to
        # templates that test it, and templates that concatenate it, SmolLM2's, do not fail on it).
        text = self.text()
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": "" if text is None else text}
        if self.tool_calls:
            message["tool_calls"] = wire_tool_calls([call.model_dump() for call in self.tool_calls])
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.role == "tool" and self.name is not None:
            message["name"] = self.name
        return message
