"""Hermes-style tool calls (Qwen 2.5 and 3, Hermes, and templates that write `<tool_call>`):

    optional text<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>...</tool_call>

Text before the first call is content. A call whose closing tag never comes (the output ended) is still
a call when its JSON is complete.
"""

from __future__ import annotations

from api.tool_parsers import Piece
from api.tool_parsers.json_text import call_of_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")


def _held_prefix(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag` (held back until told)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesParser:
    def __init__(self) -> None:
        self._buffer = ""
        self._in_call = False
        self._seen_call = False
        self._pending_space = ""  # whitespace after a call: content only if more content follows

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return pieces
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
                self._in_call = False
                self._end_call(body, OPEN + body + CLOSE, pieces)
                continue
            start = self._buffer.find(OPEN)
            if start < 0:
                keep = _held_prefix(self._buffer, OPEN)
                self._content(self._buffer[: len(self._buffer) - keep], pieces)
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return pieces
            self._content(self._buffer[:start], pieces)
            self._buffer = self._buffer[start + len(OPEN) :]
            self._in_call = True

    def close(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._in_call:
            self._end_call(self._buffer, OPEN + self._buffer, pieces)
        else:
            self._content(self._buffer, pieces)
        self._buffer, self._in_call, self._pending_space = "", False, ""
        return pieces

    def _end_call(self, body: str, raw: str, pieces: list[Piece]) -> None:
        call = call_of_text(body.strip(), ARGUMENT_KEYS)
        if call is None:
            self._content(raw, pieces)
            return
        self._pending_space = ""
        self._seen_call = True
        pieces.append(call)

    def _content(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if self._seen_call and not text.strip():
            self._pending_space += text  # the newlines between calls are not an answer
            return
        text, self._pending_space = self._pending_space + text, ""
        pieces.append(text)
