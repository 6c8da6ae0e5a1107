"""The output of a forced tool_choice, whose format the API's own constraint fixed (api/tool_request.py):

    required   [{"name": "f", "parameters": {...}}, ...]   each item one call
    named      {...}                                      the arguments of the named function

Model-agnostic: whatever the chat template says about tools, the constraint decides what is written.
"""

from __future__ import annotations

from api.tool_parsers import ArgumentsFragment, Piece, ToolCall
from api.tool_parsers.json_text import call_of_text, value_end

_SEPARATORS = " \t\r\n,"


class RequiredArrayParser:
    """Each item of the array is a call as soon as its closing brace arrives."""

    def __init__(self) -> None:
        self._buffer = ""
        self._opened = False
        self._head = ""  # the text up to "[", given back as content with the rest when no call came

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        if not self._opened:
            head = self._buffer.lstrip()
            if not head:
                return pieces
            if not head.startswith("["):
                return pieces  # not the constrained form: close() gives it back as content
            start = len(self._buffer) - len(head) + 1
            self._opened, self._head, self._buffer = True, self._buffer[:start], self._buffer[start:]
        while True:
            rest = self._buffer.lstrip(_SEPARATORS)
            if not rest.startswith("{"):
                return pieces
            end = value_end(rest, 0)
            if end is None:
                return pieces
            call = call_of_text(rest[:end], ("parameters", "arguments"))
            if call is None:
                return pieces
            self._buffer, self._head = rest[end:], ""
            pieces.append(call)

    def close(self) -> list[Piece]:
        rest = self._buffer.strip(_SEPARATORS)
        if self._opened and rest in ("", "]"):
            return []
        text = self._head + self._buffer
        return [text] if text else []


class NamedArgumentsParser:
    """The whole output is the arguments: the call opens with the first piece, then grows."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._opened = False

    def feed(self, text: str) -> list[Piece]:
        if not self._opened:
            self._opened = True
            return [ToolCall(self._name, text)]
        return [ArgumentsFragment(text)] if text else []

    def close(self) -> list[Piece]:
        if not self._opened:
            self._opened = True
            return [ToolCall(self._name, "")]
        return []
