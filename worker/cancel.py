"""Cancellation: a client (or the API on disconnect) sets `{prefix}:cancel:{id}` and then INCRs
`{prefix}:cancels` (api/attachments.py; request_cancel in tests/worker/harness.py); the worker
reads that counter once per step and, only when it moved, the cancel keys of every request it
runs (one MGET).

# NOTE: the counter keeps the per-step read one small GET instead of an MGET over every running
# request's key. Even so a waited round trip is a large share of a step under load, so the loop sends
# the check of step k before the engine schedules it and reads the reply after step k's outputs
# (worker/deferred_replies.py, decision 0025).
# A canceller that sets the key without the INCR (older clients) is still seen: every
# FULL_CHECK_S the worker reads every key regardless. The guarantee the tests assert: a cancel
# that moved the counter before the check of step k was sent frees its KV blocks before step
# k + 1 is scheduled, so a cancel is never scheduled again past the second step after it.
"""

from __future__ import annotations

import time

import redis

from worker.protocol import Keys

FULL_CHECK_S = 0.05


class CancelWatch:
    """Reads cancel keys when the cancel counter moved, or FULL_CHECK_S after the last full read.

    A check is split in two so that the loop can send it early and read its replies later
    (worker/deferred_replies.py): `commands` says what to send, `resolve` reads the replies. `check`
    does both in round trips of its own.

    Args:
        keys: the key names.
        full_check_s: longest time between full reads (cancels that did not move the counter).
    """

    def __init__(self, keys: Keys, full_check_s: float = FULL_CHECK_S) -> None:
        self.keys = keys
        self.full_check_s = full_check_s
        self._seen: bytes | str | None = None
        self._last_full = float("-inf")
        self._read_all_next = False
        self.num_full_reads = 0

    def read_all_next(self) -> None:
        """Make the next check read every key: requests admitted after a check may have been
        cancelled before it, and the counter it saw then will not move for them again."""
        self._read_all_next = True

    def commands(self, request_ids: list[str]) -> list[tuple]:
        """The GET of the counter, with the MGET of every key when a full read is due anyway."""
        if not request_ids:
            return []
        commands: list[tuple] = [("GET", self.keys.cancels)]
        if self._read_all_next or time.monotonic() - self._last_full >= self.full_check_s:
            commands.append(("MGET", *[self.keys.cancel(request_id) for request_id in request_ids]))
        return commands

    def resolve(self, request_ids: list[str], replies: list) -> list[str] | None:
        """The cancelled requests, from the replies to `commands(request_ids)`; None when the
        counter moved and no MGET went with it (the caller reads the keys now, `read_keys`)."""
        if not request_ids:
            return []
        counter = replies[0]
        if len(replies) == 1:
            return [] if counter == self._seen else None
        # NOTE: the counter is recorded as read before the MGET, so a cancel landing between the
        # two is read now or by the next check (the counter will have moved again).
        self._seen, self._last_full, self._read_all_next = counter, time.monotonic(), False
        self.num_full_reads += 1
        return [request_id for request_id, value in zip(request_ids, replies[1], strict=True) if value is not None]

    def read_keys(self, client: redis.Redis, request_ids: list[str], counter) -> list[str]:
        """The full read after a check whose counter (`counter`, as read) moved: one MGET."""
        values = client.mget([self.keys.cancel(request_id) for request_id in request_ids])
        return self.resolve(request_ids, [counter, values]) or []

    def cancelled(self, client: redis.Redis, request_ids: list[str], replies: list) -> list[str]:
        """The cancelled requests from the replies to `commands(request_ids)` (a command Redis refused raises its
        error), with the full read now where the counter moved and no MGET went with it."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        found = self.resolve(request_ids, replies)
        return self.read_keys(client, request_ids, replies[0]) if found is None else found

    def check(self, client: redis.Redis, request_ids: list[str]) -> list[str]:
        """The running requests that were cancelled (one round trip, plus one MGET when needed)."""
        commands = self.commands(request_ids)
        if not commands:
            return []
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return self.cancelled(client, request_ids, pipe.execute())
