"""One runner per batch: a token in `{prefix}:batch:lease:{id}` with a short expiry, renewed while it runs.

A second task for the same batch (a redelivered Celery message, a sweep's rescue) finds the lease held and
returns; a runner that died stops renewing, and once the lease lapses the next one takes the batch over.
"""

from __future__ import annotations

import secrets

from redis import Redis

# ARGV[1] token, ARGV[2] milliseconds. Renew: only the holder extends its lease.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class BatchLease:
    def __init__(self, redis: Redis, key: str, lease_s: float) -> None:
        self.redis = redis
        self.key = key
        self.lease_ms = max(1, int(lease_s * 1000))
        self.token = secrets.token_hex(8)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    def acquire(self) -> bool:
        return bool(self.redis.set(self.key, self.token, nx=True, px=self.lease_ms))

    def renew(self) -> bool:
        """False when the lease lapsed and another runner may hold the batch: stop at once."""
        return bool(self._renew(keys=[self.key], args=[self.token, self.lease_ms]))

    def release(self) -> None:
        self._release(keys=[self.key], args=[self.token])
