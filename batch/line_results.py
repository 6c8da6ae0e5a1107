"""The results of a batch's lines in flight: their result streams read (XREAD over all of them at once)
until each request is complete, then answered with the body the API would have sent.

A line's stream is read from its start, so a runner that replaces a dead one rebuilds every answer in
flight from the events already written (the stream is the source of truth; the request is never sent again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from api.errors import SERVER_ERROR, ApiError
from api.logprob_format import TokenTexts
from api.openai_format import CANCELLED, OPENAI_FINISH_REASONS, WholeResponse, cancelled_message
from api.request_meta import RequestMeta
from worker.protocol import ProtocolError, decode_event

# Streams read by one XREAD: a batch's lines in flight are read in slices of this many.
STREAMS_PER_READ = 256


@dataclass
class LineInFlight:
    line: int
    custom_id: str
    meta: RequestMeta
    answer: WholeResponse
    last_id: str = "0-0"
    done: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class LineAnswer:
    """A finished line: the HTTP status and body the API would have answered, or its request's abort."""

    line: int
    custom_id: str
    request_id: str
    status: int
    body: Any
    aborted: bool = False


def _failure(in_flight: LineInFlight, err: ApiError, aborted: bool = False) -> LineAnswer:
    meta = in_flight.meta
    return LineAnswer(in_flight.line, in_flight.custom_id, meta.request_id, err.status, err.body(), aborted)


class LineResults:
    """Lines in flight and their answers. `redis` must decode responses."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.in_flight: dict[str, LineInFlight] = {}  # by result stream

    def add(self, line: int, custom_id: str, meta: RequestMeta, texts: TokenTexts) -> None:
        self.in_flight[meta.result_stream] = LineInFlight(line, custom_id, meta, WholeResponse(meta, texts))

    def lines(self) -> list[LineInFlight]:
        return list(self.in_flight.values())

    def read(self, block_ms: int) -> list[LineAnswer]:
        """The lines that completed within `block_ms` (new events of any line end the wait)."""
        streams = list(self.in_flight)
        finished: list[LineAnswer] = []
        for start in range(0, len(streams), STREAMS_PER_READ):
            chunk = {s: self.in_flight[s].last_id for s in streams[start : start + STREAMS_PER_READ]}
            # NOTE: only the first slice blocks; the rest are read as they are.
            replies = self.redis.xread(chunk, count=1000, block=block_ms if start == 0 else None) or []
            for stream, entries in replies:
                answer = self._take(self.in_flight[stream], entries)
                if answer is not None:
                    finished.append(answer)
                    del self.in_flight[stream]
        return finished

    def _take(self, in_flight: LineInFlight, entries: list) -> LineAnswer | None:
        meta = in_flight.meta
        for entry_id, fields in entries:
            in_flight.last_id = entry_id
            try:
                event = decode_event(fields)
            except ProtocolError as exc:
                err = ApiError(
                    500, f"the result stream is broken: {exc}", type=SERVER_ERROR, code="broken_result_stream"
                )
                return _failure(in_flight, err)
            if event.type == "error" or (event.type == "done" and event.finish_reason not in OPENAI_FINISH_REASONS):
                if event.finish_reason == CANCELLED:
                    err = ApiError(499, cancelled_message(meta.request_id), code="request_cancelled")
                    return _failure(in_flight, err, aborted=True)
                error = event.error or f"finish_reason {event.finish_reason!r}"
                err = ApiError(500, f"generation failed: {error}", type=SERVER_ERROR, code="generation_error")
                return _failure(in_flight, err)
            in_flight.answer.add(event)
            if event.type == "done":
                in_flight.done.add(event.index)
                if len(in_flight.done) >= meta.n:
                    body = in_flight.answer.body()
                    return LineAnswer(in_flight.line, in_flight.custom_id, meta.request_id, 200, body)
        return None
