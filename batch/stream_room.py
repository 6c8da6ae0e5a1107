"""How many lines a batch may send now: it keeps the request stream's undelivered messages (every submitter's,
not only its own) below `queue_ahead`.

Why: a Redis stream is first in, first out. A line that no worker has read yet is a line every interactive
request sent after it waits behind, whatever its `priority`; the engine's priority order and preemption only
reach the requests a worker has read. Workers read as their slots free, so a runner that sends only into an
almost empty stream keeps the GPU fed by the lines the workers take while no interactive request ever finds more
than `queue_ahead` messages ahead of it. Under interactive load the stream fills with interactive requests
and the batch waits: it takes only the capacity they leave.

The count is the consumer group's `lag` (XINFO GROUPS: entries added and not yet delivered); before any worker
made the group, every entry is undelivered (XLEN). Redis cannot tell the lag after an XDEL in the undelivered
range (inferq's workers trim, they never delete): the runner then sends as if the stream were empty, within
`batch_in_flight`, rather than read entries the batch user has no business seeing (the ACL gives it no XRANGE).
"""

from __future__ import annotations

from redis import Redis, ResponseError

from worker.protocol import Keys


class StreamRoom:
    """`redis` decodes responses (batch/redis_client.py's records_client)."""

    def __init__(self, redis: Redis, wire: Keys, queue_ahead: int) -> None:
        self.redis = redis
        self.wire = wire
        self.queue_ahead = queue_ahead

    def room(self) -> int:
        """Lines that may go into the stream now."""
        return max(0, self.queue_ahead - self.undelivered())

    def undelivered(self) -> int:
        """Messages in the request stream that no worker has read (0 where the group's lag is unknown)."""
        try:
            groups = self.redis.xinfo_groups(self.wire.requests)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():  # no stream yet: nothing waits in it
                return 0
            raise  # NOPERM among others: a runner that cannot see the stream must say so, not flood it
        for group in groups:
            if group["name"] != self.wire.group:
                continue
            lag = group.get("lag")
            return 0 if lag is None else int(lag)
        return int(self.redis.xlen(self.wire.requests))
