"""A chat choice's output read as OpenAI tool calls: the parsed pieces as `delta` fields of streamed
chunks, or as a whole message.

Streamed, a call arrives as OpenAI's deltas, which the openai SDK assembles by `index`:
    {"tool_calls": [{"index": 0, "id": "call_...", "type": "function",
                     "function": {"name": "f", "arguments": "<JSON text, or its first part>"}}]}
    {"tool_calls": [{"index": 0, "function": {"arguments": "<more>"}}]}   (a named tool_choice only)
A call's id is derived from the request id, the choice and the call's position, so a stream resumed on
any replica (which replays the events through a new formatter) gives the same ids.
A choice that produced a call and ended by "stop" ends by "tool_calls".
"""

from __future__ import annotations

import hashlib
from typing import Any

from api.request_meta import RequestMeta
from api.tool_parsers import ArgumentsFragment, Piece, ToolCall
from api.tool_parsers.registry import make_parser

PARSED_MODES = ("auto", "required", "named")  # tool_choice "none" leaves the text as it is


def reads_tool_calls(meta: RequestMeta) -> bool:
    return meta.tool_mode in PARSED_MODES


def call_id(request_id: str, choice: int, position: int) -> str:
    digest = hashlib.sha256(f"{request_id}/{choice}/{position}".encode()).hexdigest()
    return f"call_{digest[:24]}"


class ChoiceToolCalls:
    """One choice's output, as content and tool-call deltas."""

    def __init__(self, meta: RequestMeta, choice: int) -> None:
        self._parser = make_parser(meta.tool_mode, meta.tool_parser, meta.tool_name)
        self._request_id = meta.request_id
        self._choice = choice
        self.calls = 0

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        return self._deltas(self._parser.feed(text))

    def close(self) -> tuple[str, list[dict[str, Any]]]:
        return self._deltas(self._parser.close())

    def finish_reason(self, finish_reason: str | None) -> str | None:
        return "tool_calls" if self.calls and finish_reason == "stop" else finish_reason

    def _deltas(self, pieces: list[Piece]) -> tuple[str, list[dict[str, Any]]]:
        content: list[str] = []
        deltas: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, str):
                content.append(piece)
            elif isinstance(piece, ToolCall):
                deltas.append(
                    {
                        "index": self.calls,
                        "id": call_id(self._request_id, self._choice, self.calls),
                        "type": "function",
                        "function": {"name": piece.name, "arguments": piece.arguments},
                    }
                )
                self.calls += 1
            elif isinstance(piece, ArgumentsFragment) and self.calls:
                deltas.append({"index": self.calls - 1, "function": {"arguments": piece.text}})
        return "".join(content), deltas


def whole_message(meta: RequestMeta, choice: int, text: str) -> tuple[dict[str, Any], ChoiceToolCalls]:
    """The assistant message of a whole response: content (null when only calls came) and tool_calls."""
    reader = ChoiceToolCalls(meta, choice)
    content_a, deltas_a = reader.feed(text)
    content_b, deltas_b = reader.close()
    calls: list[dict[str, Any]] = []
    for delta in deltas_a + deltas_b:
        if "id" in delta:
            calls.append({"id": delta["id"], "type": "function", "function": dict(delta["function"])})
        else:
            calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    content = content_a + content_b
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message, reader
