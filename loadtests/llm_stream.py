"""Server-Sent Events framing and the per-stream LLM timings that the load test reports.

Kept free of Locust and of any HTTP client so the same code measures a `requests` stream,
a Redis result stream or a test's recorded bytes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


def sse_data(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The `data` of each event in a stream of lines (an event ends at a blank line).

    Multi-line data is joined with "\\n"; comments (":" lines, e.g. pings), `id:` and `event:`
    fields are skipped, as the SSE spec says a client without listeners for them may.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


@dataclass
class StreamTimer:
    """Timings of one generation: time to first token, gaps between tokens, decode rate.

    `token(n)` is called when a chunk with n new tokens arrives (one SSE chunk or one result
    event); times are time.perf_counter() seconds, reported in milliseconds.
    """

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None
    num_tokens: int = 0
    gaps_ms: list[float] = field(default_factory=list)

    def token(self, n: int = 1, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.gaps_ms.append((now - self.last) * 1000)
        self.last = now
        self.num_tokens += max(n, 0)

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.started) * 1000

    def elapsed_ms(self, now: float | None = None) -> float:
        return ((time.perf_counter() if now is None else now) - self.started) * 1000

    def tokens_per_s(self, num_tokens: int | None = None) -> float | None:
        """Decode rate: tokens after the first over the time since the first (None: too few to tell)."""
        tokens = self.num_tokens if num_tokens is None else num_tokens
        if self.first is None or self.last is None or tokens < 2 or self.last <= self.first:
            return None
        return (tokens - 1) / (self.last - self.first)


def chunk_content(data: str) -> tuple[str, dict | None, str | None]:
    """(delta text, usage or None, error message or None) of one chat.completion.chunk."""
    chunk = json.loads(data)
    error = chunk.get("error")
    if error:
        return "", None, str(error.get("message") if isinstance(error, dict) else error)
    text = ""
    for choice in chunk.get("choices") or []:
        text += (choice.get("delta") or {}).get("content") or ""
    return text, chunk.get("usage"), None
