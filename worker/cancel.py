"""Cancellation: a client (or the API on disconnect) sets `{prefix}:cancel:{id}` and then INCRs
`{prefix}:cancels` (api/attachments.py; request_cancel in tests/worker/harness.py); the worker
reads that counter once per step and, only when it moved, the cancel keys of every request it
runs (one MGET).

# NOTE: the counter keeps the per-step round trip one small GET instead of an MGET over every
# running request's key (0.34 ms for 256 keys vs 0.14 ms for the GET on an idle local Redis).
# Under the service benchmark's load the worker's cancel checks still took 0.6-1.3 ms a step
# with the GET (0.83 ms with the MGET): the round trip, not the command, is most of it there
# (bench/results/h100/service_history.md). A canceller
# that sets the key without the INCR (older clients) is still seen: every FULL_CHECK_S the worker
# reads every key regardless. A cancel that moved the counter before the check preceding step k
# frees its KV blocks before step k + 1 runs (the guarantee the tests assert).
"""

from __future__ import annotations

import time

import redis

from worker.protocol import Keys

FULL_CHECK_S = 0.05


def cancelled_ids(client: redis.Redis, keys: Keys, request_ids: list[str]) -> list[str]:
    """The subset of request_ids whose cancel key is set (one MGET)."""
    if not request_ids:
        return []
    values = client.mget([keys.cancel(request_id) for request_id in request_ids])
    return [request_id for request_id, value in zip(request_ids, values, strict=True) if value is not None]


class CancelWatch:
    """Reads cancel keys when the cancel counter moved, or FULL_CHECK_S after the last full read.

    Args:
        keys: the key names.
        full_check_s: longest time between full reads (cancels that did not move the counter).
    """

    def __init__(self, keys: Keys, full_check_s: float = FULL_CHECK_S) -> None:
        self.keys = keys
        self.full_check_s = full_check_s
        self._seen: bytes | str | None = None
        self._last_full = float("-inf")
        self.num_full_reads = 0

    def check(self, client: redis.Redis, request_ids: list[str]) -> list[str]:
        """The running requests that were cancelled (one GET, plus one MGET when needed)."""
        if not request_ids:
            return []
        counter = client.get(self.keys.cancels)
        now = time.monotonic()
        if counter == self._seen and now - self._last_full < self.full_check_s:
            return []
        # NOTE: the counter is recorded before the MGET, so a cancel landing between the two is
        # read now or by the next check (the counter will have moved again).
        self._seen, self._last_full = counter, now
        self.num_full_reads += 1
        return cancelled_ids(client, self.keys, request_ids)
