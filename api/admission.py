"""Admission control: a bounded queue (503) and per-key rate limits (429), both in Redis.

Both are single Lua scripts, so the check and the update are one atomic step even
with many API replicas answering at once.

The queue is what the API admitted and no worker has started yet: a sorted set of
request ids (score: admission time) plus a hash of their prompt tokens. A request
leaves it when its first event arrives (it started), when its stream ends, or when
it is older than the queue timeout (its replica died: the worker drops it at its
deadline anyway). Requests other services put straight into Redis are not counted.

Rate limits are fixed one-minute windows per caller (requests, and tokens counted
as prompt + max_tokens, a reservation the way OpenAI counts them).
"""

from __future__ import annotations

import math
import time

from redis.asyncio import Redis

from api.errors import RATE_LIMIT, SERVER_ERROR, ApiError
from api.keys import ApiKeys
from api.settings import ApiSettings

# KEYS: queue zset, tokens hash. ARGV: now, stale_before, max_requests, max_tokens, id, tokens.
# Returns {1, count} when admitted, {0, "requests"|"tokens", current} when full.
_ADMIT = """
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if #stale > 0 then
  redis.call('HDEL', KEYS[2], unpack(stale))
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
end
local count = redis.call('ZCARD', KEYS[1])
if count + 1 > tonumber(ARGV[3]) then return {0, 'requests', count} end
local tokens = tonumber(ARGV[6])
if count > 0 then
  local total = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(v) end
  if total + tokens > tonumber(ARGV[4]) then return {0, 'tokens', total} end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[5])
redis.call('HSET', KEYS[2], ARGV[5], tokens)
return {1, count + 1}
"""

# KEYS: requests counter, tokens counter of this window. ARGV: rpm, tpm, tokens, ttl.
# Returns {1} when allowed, {0, "requests"|"tokens", used} when over.
_RATE = """
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local used_requests = tonumber(redis.call('GET', KEYS[1]) or '0')
local used_tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
if rpm > 0 and used_requests + 1 > rpm then return {0, 'requests', used_requests} end
if tpm > 0 and used_tokens + tokens > tpm then return {0, 'tokens', used_tokens} end
redis.call('INCR', KEYS[1])
redis.call('INCRBY', KEYS[2], tokens)
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {1}
"""

RATE_WINDOW_S = 60


class Admission:
    """Queue cap and rate limits of one replica (state in Redis)."""

    def __init__(self, redis: Redis, keys: ApiKeys, settings: ApiSettings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._admit = redis.register_script(_ADMIT)
        self._rate = redis.register_script(_RATE)

    async def check_rate(self, owner: str, tokens: int) -> None:
        """Raise 429 with Retry-After if the caller is over its per-minute limits."""
        rpm, tpm = self.settings.rate_limit_rpm, self.settings.rate_limit_tpm
        if not rpm and not tpm:
            return
        now = time.time()
        window = int(now // RATE_WINDOW_S)
        retry_after = max(1, math.ceil((window + 1) * RATE_WINDOW_S - now))
        if tpm and tokens > tpm:
            raise ApiError(
                429,
                f"this request needs {tokens} tokens (prompt + max_tokens), over the limit of {tpm} tokens per "
                "minute on its own; lower max_tokens or the prompt",
                type=RATE_LIMIT,
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry_after)},
            )
        result = await self._rate(
            keys=[self.keys.rate(owner, window, "requests"), self.keys.rate(owner, window, "tokens")],
            args=[rpm, tpm, tokens, RATE_WINDOW_S * 2],
        )
        if int(result[0]) == 1:
            return
        kind, used = result[1], int(result[2])
        limit = rpm if kind == "requests" else tpm
        raise ApiError(
            429,
            f"rate limit reached: {used} {kind} used of {limit} per minute; retry after {retry_after} s",
            type=RATE_LIMIT,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )

    async def admit(self, request_id: str, prompt_tokens: int) -> None:
        """Put the request in the bounded queue, or raise 503 with Retry-After when it is full."""
        s = self.settings
        now = time.time()
        result = await self._admit(
            keys=[self.keys.queue, self.keys.queue_tokens],
            args=[
                now,
                now - s.queue_timeout_s - 5.0,
                s.max_queued_requests,
                s.max_queued_prompt_tokens,
                request_id,
                prompt_tokens,
            ],
        )
        if int(result[0]) == 1:
            return
        kind, current = result[1], int(result[2])
        if kind == "requests":
            detail = f"{current} requests are queued (limit {s.max_queued_requests})"
        else:
            detail = f"{current} prompt tokens are queued (limit {s.max_queued_prompt_tokens})"
        raise ApiError(
            503,
            f"the server is overloaded: {detail}; retry after {s.overload_retry_after_s} s",
            type=SERVER_ERROR,
            code="overloaded",
            headers={"Retry-After": str(s.overload_retry_after_s)},
        )

    async def release(self, request_id: str) -> None:
        """The request started (or ended, or was never sent): it no longer counts as queued."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.keys.queue, request_id)
            pipe.hdel(self.keys.queue_tokens, request_id)
            await pipe.execute()

    async def queued(self) -> tuple[int, int]:
        """(requests, prompt tokens) admitted and not yet started, across replicas."""
        count = await self.redis.zcard(self.keys.queue)
        tokens = sum(int(v) for v in await self.redis.hvals(self.keys.queue_tokens))
        return count, tokens
