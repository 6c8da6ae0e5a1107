"""How many lines a batch may send now: it keeps a batch within what the workers run, plus `queue_ahead`.

Why: a Redis stream is first in, first out. A line that no worker has read yet is a line every interactive
request sent after it waits behind, whatever its `priority`; the engine's priority order and preemption only
reach the requests a worker has read. So the runner bounds two counts, both from the workers' consumer group
(XINFO GROUPS), every submitter's messages in them, not only its own:

- the messages no worker has read (the group's `lag`) stay below `queue_ahead`;
- every message sent and not yet finished (`lag` + `pending`, the group's read and unacknowledged) stays below
  the live workers' sequence slots (batch/worker_slots.py) plus `ahead`: `queue_ahead` or a quarter of the
  slots, whichever is more.

A worker does not count batch lines against its slots when it reads (worker/message_intake.py), so it reads
the lines beyond its slots into its engine, the stream stays empty, and an interactive request is read at the
next step and takes a line's slot (decision 0066). The lines waiting in the engine keep its slots full across
the time from a line's end to the runner's next line reaching the worker (a loop turn here, a step there); a
quarter of the slots covers about 200 ms at the Qwen3-0.6B shape on an H200. Under
interactive load `pending` grows and the batch waits: it takes only the capacity interactive requests leave.
Where no heartbeat gives slots (workers older than the field) only the first bound holds (decision 0064).

Before any worker made the group, every entry is undelivered (XLEN). Redis cannot tell the lag after an XDEL in
the undelivered range (inferq's workers trim, they never delete): the runner then counts it as 0, within
`batch_in_flight`, rather than read entries the batch user has no business seeing (the ACL gives it no XRANGE).
"""

from __future__ import annotations

from redis import Redis, ResponseError

from batch.worker_slots import WorkerSlots
from worker.protocol import Keys


class StreamRoom:
    """`redis` decodes responses (batch/redis_client.py's records_client); `slots` the workers' slots (by
    default looked up through the same client)."""

    def __init__(self, redis: Redis, wire: Keys, queue_ahead: int, slots: WorkerSlots | None = None) -> None:
        self.redis = redis
        self.wire = wire
        self.queue_ahead = queue_ahead
        self.slots = slots or WorkerSlots(redis, wire)

    def room(self) -> int:
        """Lines that may go into the stream now."""
        unread, unfinished = self.counts()
        room = self.queue_ahead - unread
        slots = self.slots.total()
        if slots:
            room = min(room, slots + max(self.queue_ahead, slots // 4) - unfinished)
        return max(0, room)

    def counts(self) -> tuple[int, int]:
        """(messages no worker has read, messages sent and not finished: those plus the group's pending)."""
        try:
            groups = self.redis.xinfo_groups(self.wire.requests)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():  # no stream yet: nothing waits in it
                return 0, 0
            raise  # NOPERM among others: a runner that cannot see the stream must say so, not flood it
        for group in groups:
            if group["name"] != self.wire.group:
                continue
            lag = 0 if group.get("lag") is None else int(group["lag"])
            return lag, lag + int(group.get("pending") or 0)
        unread = int(self.redis.xlen(self.wire.requests))
        return unread, unread
