"""Cancellation: a client (or the API on disconnect) sets `{prefix}:cancel:{id}`; the worker looks
at the keys of the requests it runs once per step, with one MGET.

# NOTE: the MGET is the loop's only per-step Redis round trip. It stays synchronous on purpose:
# one round trip is far below a step's time, and a cancel seen at step k frees its KV blocks
# before step k + 1 runs (the guarantee the tests assert).
"""

from __future__ import annotations

import redis

from worker.protocol import DEFAULT_CANCEL_TTL_S, Keys


def cancelled_ids(client: redis.Redis, keys: Keys, request_ids: list[str]) -> list[str]:
    """The subset of request_ids whose cancel key is set (one MGET)."""
    if not request_ids:
        return []
    values = client.mget([keys.cancel(request_id) for request_id in request_ids])
    return [request_id for request_id, value in zip(request_ids, values, strict=True) if value is not None]


def request_cancel(client: redis.Redis, keys: Keys, request_id: str, ttl_s: int = DEFAULT_CANCEL_TTL_S) -> None:
    """What a submitter does to cancel a request (for tools and tests; the API does the same)."""
    client.set(keys.cancel(request_id), "1", ex=ttl_s)
