"""Cancellation: a client (or the API on disconnect) sets `{prefix}:cancel:{id}` and then PUBLISHes
the id on the channel `{prefix}:cancels` (api/attachments.py; request_cancel in
tests/worker/harness.py). The worker holds a subscription to that channel and, before each engine
step, takes the messages already in its socket without waiting (no round trip); every FULL_CHECK_S
it also reads the cancel keys of every request it runs (one MGET).

# NOTE (why a subscription): a round trip per step, even a single GET of a counter, took 0.6-1.3 ms
# a step under the service benchmark's load (bench/results/h100/service_history.md): single-threaded
# Redis answers it after whatever it is running, often the publisher's per-step EVAL of every
# stream's events. Taking pushed messages costs a non-blocking socket read.
# The full read catches what no message announces: a canceller that only sets the key, and
# messages lost while the subscription was down (a new subscription starts with a full read).
# A cancel whose message reached the worker's socket before the check preceding step k frees its
# KV blocks before step k + 1 runs; Redis writes a PUBLISH to its subscribers in the same event
# loop turn as its reply to the publisher, so on a local Redis that is as soon as the canceller
# has its reply (the tests assert the two-step bound).
"""

from __future__ import annotations

import contextlib
import time

import redis
from redis.client import PubSub

from worker.protocol import Keys, as_text

FULL_CHECK_S = 0.05


def cancelled_ids(client: redis.Redis, keys: Keys, request_ids: list[str]) -> list[str]:
    """The subset of request_ids whose cancel key is set (one MGET)."""
    if not request_ids:
        return []
    values = client.mget([keys.cancel(request_id) for request_id in request_ids])
    return [request_id for request_id, value in zip(request_ids, values, strict=True) if value is not None]


class CancelWatch:
    """Cancelled requests among the running ones, from the cancel channel and a periodic full read.

    Args:
        keys: the key names.
        full_check_s: longest time between full reads of the running requests' cancel keys.
    """

    def __init__(self, keys: Keys, full_check_s: float = FULL_CHECK_S) -> None:
        self.keys = keys
        self.full_check_s = full_check_s
        self._pubsub: PubSub | None = None
        self._last_full = float("-inf")
        self.num_full_reads = 0
        self.num_messages = 0

    def check(self, client: redis.Redis, request_ids: list[str]) -> list[str]:
        """The running requests that were cancelled: pushed messages (no round trip), plus one MGET
        when the full-read period is over or the subscription is new.

        NOTE: a connection error that redis-py does not retry itself closes the subscription and
        propagates (the caller backs off); the next check subscribes again and reads every key.
        """
        try:
            announced = self._drain(client)
            now = time.monotonic()
            if request_ids and now - self._last_full >= self.full_check_s:
                self._last_full = now
                self.num_full_reads += 1
                announced.update(cancelled_ids(client, self.keys, request_ids))
        except BaseException:
            self.close()
            raise
        return [request_id for request_id in request_ids if request_id in announced]

    def _drain(self, client: redis.Redis) -> set[str]:
        """Request ids of the messages already received (waits for none)."""
        if self._pubsub is None:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.keys.cancels)
            except BaseException:
                pubsub.close()
                raise
            self._pubsub = pubsub
            self._last_full = float("-inf")  # cancels published while unsubscribed: read every key
            # NOTE: redis-py reconnects a broken subscription by itself (and subscribes again), so
            # the messages of the gap are lost without an error: its reconnects force a full read too.
            pubsub.connection.register_connect_callback(self._reconnected)
        ids = set()
        while (message := self._pubsub.get_message(timeout=0.0)) is not None:
            if message.get("type") == "message":
                ids.add(as_text(message["data"]))
                self.num_messages += 1
        return ids

    def _reconnected(self, connection: object) -> None:
        self._last_full = float("-inf")

    def close(self) -> None:
        if self._pubsub is not None:
            pubsub, self._pubsub = self._pubsub, None
            with contextlib.suppress(Exception):  # a broken connection is closed anyway
                pubsub.close()
