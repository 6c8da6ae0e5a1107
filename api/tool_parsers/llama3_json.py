"""Llama 3.x JSON tool calls: the whole output is one or more JSON objects, maybe after `<|python_tag|>`,
several separated by `;`:

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ..., "parameters": ...}

An output that starts with anything else is content (Llama 3 answers in text or calls tools, not both).
An output that starts like a call and is not one (`{"answer": 42}`) is content too, unchanged.
"""

from __future__ import annotations

from api.tool_parsers import Piece
from api.tool_parsers.json_text import call_of_text, value_end

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")
_SEPARATORS = " \t\r\n;"
UNDECIDED, CONTENT, CALLS = "undecided", "content", "calls"


class Llama3JsonParser:
    def __init__(self) -> None:
        self._mode = UNDECIDED
        self._buffer = ""

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        if self._mode == UNDECIDED:
            self._decide()
        if self._mode == CONTENT:
            out, self._buffer = self._buffer, ""
            return [out] if out else []
        if self._mode == CALLS:
            return self._read_calls()
        return []

    def _decide(self) -> None:
        head = self._buffer.lstrip()
        if head.startswith(PYTHON_TAG):
            self._mode, self._buffer = CALLS, head[len(PYTHON_TAG) :]
        elif head.startswith("{"):
            self._mode = CALLS
        elif head and not PYTHON_TAG.startswith(head):
            self._mode = CONTENT

    def _read_calls(self) -> list[Piece]:
        pieces: list[Piece] = []
        while True:
            rest = self._buffer.lstrip(_SEPARATORS)
            if not rest:
                return pieces
            if not rest.startswith("{"):
                return pieces + self._give_up()
            end = value_end(rest, 0)
            if end is None:
                return pieces
            call = call_of_text(rest[:end], ARGUMENT_KEYS)
            if call is None:
                return pieces + self._give_up()
            self._buffer = rest[end:]
            pieces.append(call)

    def _give_up(self) -> list[Piece]:
        """Not a call: the rest is content (all of the output, when no call came before)."""
        self._mode = CONTENT
        out, self._buffer = self._buffer, ""
        return [out] if out else []

    def close(self) -> list[Piece]:
        # NOTE: after calls, separators alone (a trailing ";" or newline) are no content.
        rest, self._buffer = self._buffer, ""
        keep = rest.strip(_SEPARATORS) or (self._mode == UNDECIDED and rest)
        return [rest] if keep else []
