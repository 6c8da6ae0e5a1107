"""Resuming a request another worker started: what its result stream already holds.

The result stream is the truth. A request claimed from a dead worker is re-submitted to the
engine as prompt + the tokens already written (`prior_output_token_ids`), so generation goes on
at the next token and the next seq; greedy and seeded sampling continue exactly as they would
have (the engine's sampling noise is a function of seed and position).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis

from worker.protocol import ProtocolError, decode_event, seq_from_stream_id

logger = logging.getLogger(__name__)


@dataclass
class PriorOutput:
    """What a result stream holds: per-choice tokens, finished choices, the next free seq."""

    next_seq: int = 1
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    done_indices: set[int] = field(default_factory=set)
    errored: bool = False

    @property
    def has_output(self) -> bool:
        return self.next_seq > 1

    def is_complete(self, n: int) -> bool:
        return self.errored or len(self.done_indices) >= n

    def engine_prior(self, n: int) -> list[int] | list[list[int]] | None:
        """prior_output_token_ids for engine.add_request: a list for n == 1, one per choice otherwise."""
        if not any(self.token_ids.values()):
            return None
        if n == 1:
            return list(self.token_ids.get(0, []))
        return [list(self.token_ids.get(i, [])) for i in range(n)]


def parse_prior(entries: list) -> PriorOutput:
    """Fold XRANGE entries [(id, fields), ...] into a PriorOutput."""
    prior = PriorOutput()
    for entry_id, fields in entries:
        seq = seq_from_stream_id(entry_id)
        prior.next_seq = max(prior.next_seq, seq + 1)
        try:
            event = decode_event(fields)
        except ProtocolError as exc:
            logger.warning("ignoring unreadable result event %s: %s", entry_id, exc)
            continue
        if event.type == "token":
            prior.token_ids.setdefault(event.index, []).extend(event.token_ids or [])
        elif event.type == "done":
            prior.done_indices.add(event.index)
        else:
            prior.errored = True
    return prior


def queue_prior_reads(pipe, streams: list[str]) -> None:
    """Queues the XRANGE of every stream on `pipe` (a non-transactional pipeline), for `parse_priors`."""
    for stream in streams:
        pipe.xrange(stream, "-", "+")


def parse_priors(streams: list[str], results: list) -> list[PriorOutput]:
    """The PriorOutput of each stream from its XRANGE result (executed with raise_on_error=False)."""
    priors = []
    for stream, result in zip(streams, results, strict=True):
        if isinstance(result, redis.ResponseError):
            # e.g. WRONGTYPE: the key is not a stream. Admission will fail writing to it too.
            logger.warning("cannot read result stream %s: %s", stream, result)
            result = []
        elif isinstance(result, Exception):
            raise result
        priors.append(parse_prior(result))
    return priors
