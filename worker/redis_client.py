"""The worker's Redis connection and how it rides out Redis going away.

Every caller treats `CONNECTION_ERRORS` the same way: keep the engine's state, wait with
`Backoff`, try again. Nothing the worker holds is lost while Redis is down: the engine keeps
generating, the publisher queues the events, leases are renewed when Redis is back.
"""

from __future__ import annotations

import random
import time

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError, OSError)

SOCKET_TIMEOUT_S = 5.0  # longer than any blocking read the worker issues (idle_block_ms)
CONNECT_TIMEOUT_S = 1.0


def make_client(url: str, *, socket_timeout: float = SOCKET_TIMEOUT_S) -> redis.Redis:
    """A pooled, thread-safe client. Its own retry stays short: the worker's loops do the waiting."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
        retry_on_error=[redis.BusyLoadingError],
    )


def is_nogroup(exc: BaseException) -> bool:
    """The consumer group (or its stream) is missing: Redis restarted empty, or someone deleted it."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("NOGROUP")


def is_duplicate_id(error: BaseException | str | bytes) -> bool:
    """XADD with an explicit id at or below the stream's top: the event is already written.
    Takes the exception redis-py raised or the error text a script returned."""
    if isinstance(error, bytes):
        error = error.decode(errors="replace")
    if isinstance(error, BaseException) and not isinstance(error, redis.ResponseError):
        return False
    return "equal or smaller" in str(error)


class Backoff:
    """Exponential backoff with jitter between `base_s` and `cap_s`, reset by `success()`."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 2.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0
        self.retry_at = 0.0

    def failure(self) -> float:
        """Records a failure; returns how long to wait before the next try."""
        delay = min(self.cap_s, self.base_s * 2**self.failures) * random.uniform(0.5, 1.0)
        self.failures += 1
        self.retry_at = time.monotonic() + delay
        return delay

    def success(self) -> None:
        self.failures = 0
        self.retry_at = 0.0

    @property
    def is_failing(self) -> bool:
        return self.failures > 0

    @property
    def may_retry(self) -> bool:
        return time.monotonic() >= self.retry_at
