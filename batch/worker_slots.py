"""How many requests the live workers can run at once: the sum of the `slots` their heartbeats carry.

A Batch API runner keeps a batch within that many requests in flight, plus a few queued ahead
(batch/stream_room.py). The heartbeats (`{prefix}:worker:{consumer}`, a short TTL) change their slots only when
a worker comes or goes, so the sum is looked up again every REFRESH_S, not for each line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from redis import Redis

from worker.protocol import Keys

REFRESH_S = 2.0


def slots_of(raw: str | None) -> int:
    """A heartbeat's slots; 0 for a record without them (a worker older than the field) or one unreadable."""
    try:
        return max(0, int(json.loads(raw).get("slots") or 0)) if raw else 0
    except (ValueError, TypeError, AttributeError):
        return 0


class WorkerSlots:
    """`redis` decodes responses (batch/redis_client.py's records_client)."""

    def __init__(self, redis: Redis, wire: Keys, clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self.wire = wire
        self.clock = clock
        self._total = 0
        self._refresh_at = 0.0

    def total(self) -> int:
        """The live workers' slots, as of at most REFRESH_S ago; 0 when none says (no worker, or old ones)."""
        now = self.clock()
        if now >= self._refresh_at:
            keys = list(self.redis.scan_iter(match=self.wire.worker_pattern, count=100))
            self._total = sum(slots_of(raw) for raw in (self.redis.mget(keys) if keys else []))
            self._refresh_at = now + REFRESH_S
        return self._total
