"""Reading the request stream: own pending first, abandoned messages of dead workers, then new ones.

All reads go through the consumer group, so each message is held by exactly one consumer at a
time (its pending entries list, PEL). How many to read, and when, is the intake's decision
(worker/message_intake.py): this module only speaks Redis.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from worker.protocol import Keys
from worker.redis_client import is_nogroup

logger = logging.getLogger(__name__)


@dataclass
class Delivery:
    """One message as read. fields is None when the entry was deleted while pending."""

    message_id: str
    fields: dict[bytes, bytes] | None
    delivery_count: int


def _id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _field_dict(fields) -> dict[bytes, bytes]:
    """A raw reply's entry fields (a flat [name, value, ...] list) as redis-py's parsed dict."""
    if isinstance(fields, dict):
        return fields
    return dict(zip(fields[::2], fields[1::2], strict=True))


class StreamReader:
    """Args:
    client: Redis client.
    keys: key names.
    consumer: this worker's consumer name.
    lease_ms: messages idle longer than this belong to a dead worker and may be claimed.
    """

    def __init__(self, client: redis.Redis, keys: Keys, consumer: str, lease_ms: int) -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.lease_ms = lease_ms

    def ensure_group(self) -> None:
        """Create the stream and group if missing. From id 0: jobs queued before any worker ran count."""
        try:
            self.client.xgroup_create(self.keys.requests, self.keys.group, id="0", mkstream=True)
            logger.info("created consumer group %s on %s", self.keys.group, self.keys.requests)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _with_group(self, command, *args, **kwargs):
        """Run a group command; if the group vanished (Redis restarted empty), recreate it and retry once."""
        try:
            return command(*args, **kwargs)
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            logger.warning("consumer group missing (Redis restarted empty?); recreating it")
            self.ensure_group()
            return command(*args, **kwargs)

    def read_new(self, count: int, block_ms: int | None) -> list[Delivery]:
        """Up to `count` never-delivered messages; blocks up to block_ms when there are none (None: no wait)."""
        # NOTE: redis-py's block=0 means "forever"; callers pass None for "do not wait".
        assert block_ms is None or block_ms > 0
        reply = self._with_group(
            self.client.xreadgroup,
            self.keys.group,
            self.consumer,
            {self.keys.requests: ">"},
            count=count,
            block=block_ms,
        )
        return [Delivery(_id(mid), fields, 1) for _, entries in reply or [] for mid, fields in entries]

    def read_new_command(self, count: int) -> tuple:
        """read_new(count, None) as a raw command, for a caller that reads its reply later
        (worker/deferred_replies.py); `new_deliveries` turns the reply into deliveries."""
        return ("XREADGROUP", "GROUP", self.keys.group, self.consumer, "COUNT", count, "STREAMS", self.keys.requests,
                ">")  # fmt: skip

    def new_deliveries(self, reply) -> list[Delivery]:
        """The messages of a raw XREADGROUP reply; a missing group is recreated (nothing was read)."""
        if isinstance(reply, redis.ResponseError):
            if not is_nogroup(reply):
                raise reply
            logger.warning("consumer group missing (Redis restarted empty?); recreating it")
            self.ensure_group()
            return []
        streams = reply.items() if isinstance(reply, dict) else reply or []  # RESP3 answers a map
        return [Delivery(_id(mid), _field_dict(fields), 1) for _, entries in streams for mid, fields in entries]

    def read_own_pending(self, count: int) -> list[Delivery]:
        """Messages already delivered to this consumer name (a restart with a stable name, a reconnect)."""
        deliveries: list[Delivery] = []
        last = "0"
        while len(deliveries) < count:
            reply = self._with_group(
                self.client.xreadgroup,
                self.keys.group,
                self.consumer,
                {self.keys.requests: last},
                count=count - len(deliveries),
            )
            entries = [entry for _, stream_entries in reply or [] for entry in stream_entries]
            if not entries:
                break
            deliveries += [Delivery(_id(mid), fields or None, 0) for mid, fields in entries]
            last = deliveries[-1].message_id
        return self._with_counts(deliveries)

    def claim_abandoned(self, count: int) -> list[Delivery]:
        """XAUTOCLAIM up to `count` messages idle longer than the lease (their worker is gone)."""
        deliveries: list[Delivery] = []
        cursor = "0-0"
        while len(deliveries) < count:
            reply = self._with_group(
                self.client.xautoclaim,
                self.keys.requests,
                self.keys.group,
                self.consumer,
                self.lease_ms,
                start_id=cursor,
                count=count - len(deliveries),
            )
            cursor = _id(reply[0])
            deliveries += [Delivery(_id(mid), fields or None, 0) for mid, fields in reply[1]]
            if cursor == "0-0":
                break
        if deliveries:
            logger.info("claimed %d abandoned message(s)", len(deliveries))
        return self._with_counts(deliveries)

    def _with_counts(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Fill in delivery counts from XPENDING (one pipeline), for poison detection."""
        if not deliveries:
            return deliveries
        pipe = self.client.pipeline(transaction=False)
        for delivery in deliveries:
            pipe.xpending_range(self.keys.requests, self.keys.group, delivery.message_id, delivery.message_id, 1)
        for delivery, rows in zip(deliveries, pipe.execute(), strict=True):
            delivery.delivery_count = int(rows[0]["times_delivered"]) if rows else 1
        return deliveries

    def trim_acknowledged(self) -> int:
        """XTRIM the request stream below every message that is still pending or undelivered.

        # NOTE: safe only while this group is the stream's one reader: entries older than both the
        # group's last-delivered id and its oldest pending entry were delivered and acknowledged.
        Returns how many entries Redis removed.
        """
        groups = [g for g in self.client.xinfo_groups(self.keys.requests) if _id(g["name"]) == self.keys.group]
        if not groups:
            return 0
        safe = _id(groups[0]["last-delivered-id"])
        summary = self.client.xpending(self.keys.requests, self.keys.group)
        if summary["pending"]:
            safe = min(safe, _id(summary["min"]), key=lambda i: tuple(int(p) for p in i.split("-")))
        if safe == "0-0":
            return 0
        return self.client.xtrim(self.keys.requests, minid=safe, approximate=False)
