"""Reading tool calls out of a model's text, one format per file, whole or streamed.

Every parser is incremental: `feed(text)` takes the next piece of output and returns what can be told
already, `close()` the rest at the end. A whole response is `feed(all) + close()`, so a streamed answer
assembles to exactly the whole one, however the text was cut. Pieces are
    str                  content (text outside any tool call)
    ToolCall             one complete call (its arguments as JSON text)
    ArgumentsFragment    more arguments of the last call (a named tool_choice streams them as they come)
Text that looks like a tool call and is not one (bad JSON, no name) comes back as content, unchanged.

The parser of a model is picked from its chat template (registry.py) unless INFERQ_TOOL_PARSER names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class ArgumentsFragment:
    text: str


Piece = str | ToolCall | ArgumentsFragment


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def close(self) -> list[Piece]: ...


def parse_whole(parser: ToolCallParser, text: str) -> list[Piece]:
    return parser.feed(text) + parser.close()
