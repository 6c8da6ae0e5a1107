"""A request's result events, in sequence order, exactly once: pub/sub live, the result stream as truth.

    source = EventSource(redis, hub, wire_keys, request_id, result_stream, n, after_seq)
    await source.open()          # subscribe FIRST (api/event_hub.py: the process's shared connection) ...
    await redis.xadd(...)        # ... then enqueue, so no event is published before we listen
    async for event in source.events(): ...   # (open(confirmed=False): events() waits for the confirmation)
    await source.close()

NOTE: a worker writes each event to the result stream before it publishes it, so an
event seen on the channel can always be read back from the stream. The channel is only
a fast path and a wake-up: an event is yielded only when every lower seq has been
yielded, reading the stream (XRANGE "(0-{last}" +) whenever the channel skips a seq,
when the API (re)attaches, and every `poll_s` of silence (a lost pub/sub message,
a Redis reconnect).

`events(idle_s=...)` also yields None whenever `idle_s` pass without an event: the relay's cue for a
keep-alive (api/streaming.py), which a stream whose tokens flow never needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from api.event_hub import EventHub, Subscription
from worker.protocol import Keys, ProtocolError, ResultEvent, decode_event, seq_from_stream_id, stream_id

log = logging.getLogger("inferq.api")


class BrokenEventStream(Exception):
    """A worker wrote an event that breaks the contract; the request cannot be relayed."""


class NotStarted(Exception):
    """No event arrived before the start deadline (no worker took the request in time)."""


class EventSource:
    """Yields a request's events after `after_seq` until the request is complete."""

    def __init__(
        self,
        redis: Redis,
        hub: EventHub,
        keys: Keys,
        request_id: str,
        result_stream: str,
        n: int,
        after_seq: int = 0,
        poll_s: float = 1.0,
        start_timeout_s: float | None = None,
    ) -> None:
        self.redis = redis
        self.hub = hub
        self.channel = keys.events(request_id)
        self.result_stream = result_stream
        self.n = n
        self.last_seq = after_seq
        self.poll_s = poll_s
        self.start_timeout_s = start_timeout_s
        self.start_deadline = time.monotonic() + start_timeout_s if start_timeout_s is not None else None
        self.done_choices: set[int] = set()
        self.failed = False
        self._subscription: Subscription | None = None

    @property
    def complete(self) -> bool:
        return self.failed or len(self.done_choices) >= self.n

    async def open(self, *, confirmed: bool = True) -> None:
        """Subscribes; confirmed=False returns once the SUBSCRIBE is sent, and `events()` waits for Redis's
        confirmation before it reads the result stream (api/submit.py enqueues meanwhile)."""
        self._subscription = await self.hub.subscribe(self.channel, confirmed=confirmed)

    async def close(self) -> None:
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            await subscription.close()

    def _accept(self, event: ResultEvent) -> ResultEvent:
        self.last_seq = event.seq
        if event.type == "done":
            self.done_choices.add(event.index)
        elif event.type == "error":
            self.failed = True
        return event

    async def _read_stream(self) -> list[ResultEvent]:
        """Every event after last_seq that the result stream holds now."""
        entries = await self.redis.xrange(self.result_stream, min=f"({stream_id(self.last_seq)}", max="+")
        events = []
        expected = self.last_seq + 1
        for entry_id, fields in entries:
            try:
                event = decode_event(fields)
            except ProtocolError as exc:
                raise BrokenEventStream(f"result event {entry_id} breaks the protocol: {exc}") from None
            if event.seq != seq_from_stream_id(entry_id) or event.seq != expected:
                raise BrokenEventStream(f"result event {entry_id} has seq {event.seq}, expected {expected}")
            events.append(event)
            expected += 1
        return events

    async def events(self, idle_s: float | None = None) -> AsyncIterator[ResultEvent | None]:
        """Ordered events until the request is complete (all n choices done, or an error); with `idle_s`, None
        each time that long passes without one (never while events arrive faster than that)."""
        if self._subscription is None:
            raise RuntimeError("EventSource.open() must be awaited before events()")
        # NOTE: the stream is read only once the channel is listened to: an event published before that
        # was written to the stream before it was published, so this read has it.
        await self._subscription.confirmed()
        for event in await self._read_stream():  # what was written before we attached
            yield self._accept(event)
            if self.complete:
                return
        last_yield = time.monotonic()
        while not self.complete:
            now = time.monotonic()
            if self.start_deadline is not None and self.last_seq == 0 and now > self.start_deadline:
                raise NotStarted(f"no worker started the request within {self.start_timeout_s:g} s")
            wait = self.poll_s if idle_s is None else max(0.0, min(self.poll_s, last_yield + idle_s - now))
            data = await self._subscription.get(timeout=wait)
            if data is None:
                backlog = await self._read_stream()
            else:
                try:
                    live = decode_event(data)
                except ProtocolError as exc:
                    log.warning("ignoring a malformed live event on %s: %s", self.channel, exc)
                    continue
                if live.seq <= self.last_seq:
                    continue  # a duplicate of what the stream already gave us
                backlog = [live] if live.seq == self.last_seq + 1 else await self._read_stream()
            for event in backlog:
                yield self._accept(event)
                last_yield = time.monotonic()
                if self.complete:
                    return
            if idle_s is not None and time.monotonic() - last_yield >= idle_s:
                yield None
                last_yield = time.monotonic()
