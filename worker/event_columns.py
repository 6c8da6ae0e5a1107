"""One step's token events as columns: what the engine loop hands over for every running request at every step.

Why: at full batch the worker's one thread is the service's bottleneck (decisions 0023, 0033), and a token event
built as a ResultEvent in an EventWrite, then packed into tuples and pickled for the publisher process, cost the
loop microseconds an event in Python objects (decision 0024). Here
the loop appends each event's few values to lists (pickled as a handful of objects a token, not a score), and
the writing side (the publisher process, or its thread) encodes them straight into its script's arguments
(worker/event_publisher.py, worker.protocol.encode_token_for_write).

Order: a step's token events are written before its other events (`Batch.segments`), and
worker/events_from_outputs.py numbers them so (a step's token events take their sequence numbers before its
"done" and "error" events), since a result stream's ids must grow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TokenEvents:
    """Token events of one step, column by column (entry i of every list is event i).

    Args:
        worker: the consumer name every event carries.
    """

    worker: str
    request_ids: list[str] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    # event i -> its prompt logprobs (JSON), for the few first tokens of requests that asked: a column of its own
    # that is empty for nearly every step, so the other events carry nothing for it
    prompt_logprobs: dict[int, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, request_id: str, stream: str, channel: str, seq: int, index: int, text: str,
            token_ids: list[int], logprobs: Any, prompt_logprobs: Any = None) -> None:  # fmt: skip
        """One event, for the few callers off the per-step loop (worker/events_from_outputs.py appends inline)."""
        self.request_ids.append(request_id)
        self.streams.append(stream)
        self.channels.append(channel)
        self.seqs.append(seq)
        self.indexes.append(index)
        self.texts.append(text)
        self.token_ids.append(token_ids)
        self.logprobs.append(logprobs)
        if prompt_logprobs is not None:
            self.prompt_logprobs[len(self.seqs) - 1] = prompt_logprobs

    def as_tuple(self) -> tuple:
        """The columns as a plain tuple (what crosses the publisher's pipe); `from_tuple` reverses it."""
        return (self.worker, self.request_ids, self.streams, self.channels, self.seqs, self.indexes, self.texts,
                self.token_ids, self.logprobs, self.prompt_logprobs)  # fmt: skip

    @classmethod
    def from_tuple(cls, wire: tuple) -> TokenEvents:
        return cls(*wire)
