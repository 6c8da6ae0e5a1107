"""Admission control: a bounded queue (503), each API key's share of it and per-key rate limits (429), in Redis.

They are single Lua scripts, so the check and the update are one atomic step even
with many API replicas answering at once.

The queue is what the API admitted and no worker has started yet: a sorted set of
request ids (score: admission time) plus two hashes, of their prompt tokens and of
their callers. A request leaves it when its first event arrives (it started), when
its stream ends, or when it is older than the queue timeout (its replica died: the
worker drops it at its deadline anyway). Requests other services put straight into
Redis are not counted. One API key may hold at most its share of the queue
(INFERQ_MAX_QUEUED_PER_KEY_FRACTION), so that one tenant's burst leaves room for the
others. A request without an Idempotency-Key is admitted by a second script that, in
the same step, also saves its meta and XADDs it to the request stream (api/submit.py
says why).

Rate limits are fixed one-minute windows per caller (requests, and tokens counted
as prompt + max_tokens, a reservation the way OpenAI counts them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from redis.asyncio import Redis

from api.errors import RATE_LIMIT, SERVER_ERROR, ApiError
from api.intake import admission_answered
from api.keys import ApiKeys
from api.settings import ApiSettings

# The queue part both admission scripts share: drop stale entries, refuse when full or when the caller holds its
# share, else queue the request.
# KEYS: queue zset, tokens hash, owners hash. ARGV: now, stale_before, max_requests, max_tokens, id, tokens, owner,
# max_per_owner (0: no share). Refuses with {0, "requests"|"tokens"|"owner", current}; when it falls through,
# `count` is the queue before this one.
# NOTE: an owner entry whose id left the queue without it (released by a replica that predates owners) is dropped
# when the owners outnumber the queue, so that it never counts against its caller.
_QUEUE_ADMIT = """
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if #stale > 0 then
  redis.call('HDEL', KEYS[2], unpack(stale))
  redis.call('HDEL', KEYS[3], unpack(stale))
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
local owner, max_per_owner = ARGV[7], tonumber(ARGV[8])
if max_per_owner > 0 and count > 0 then
  if redis.call('HLEN', KEYS[3]) > count then
    local entries = redis.call('HGETALL', KEYS[3])
    for i = 1, #entries, 2 do
      if not redis.call('ZSCORE', KEYS[1], entries[i]) then redis.call('HDEL', KEYS[3], entries[i]) end
    end
  end
  local mine = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[3])) do
    if v == owner then mine = mine + 1 end
  end
  if mine + 1 > max_per_owner then return {0, 'owner', mine} end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[5])
redis.call('HSET', KEYS[2], ARGV[5], tokens)
redis.call('HSET', KEYS[3], ARGV[5], owner)
"""

# Returns {1, count} when admitted.
_ADMIT = _QUEUE_ADMIT + "return {1, count + 1}\n"

# _QUEUE_ADMIT, then (admitted only) the request's meta hash with its TTL and its message on the request
# stream: a new request's whole enqueue in one round trip (api/submit.py).
# KEYS: + meta hash, request stream. ARGV: + TTL s, the number of meta fields and their names and values
# alternating, the number of message fields and theirs. Returns {1, count, entry id} when admitted.
# NOTE: `#!lua` (Redis 7, as in worker/event_write_script.py): out of memory, Redis refuses the whole script
# before it runs, where a script without it is checked at its first write only and may then write the rest.
_ADMIT_AND_ENQUEUE = (
    "#!lua\n"
    + _QUEUE_ADMIT
    + """
local function field_pairs(at)
  local n = 2 * tonumber(ARGV[at])
  local items = {}
  for i = 1, n do items[i] = ARGV[at + i] end
  return items, at + n + 1
end
local meta, message_at = field_pairs(10)
local message = field_pairs(message_at)
redis.call('HSET', KEYS[4], unpack(meta))
redis.call('EXPIRE', KEYS[4], ARGV[9])
local entry_id = redis.call('XADD', KEYS[5], '*', unpack(message))
return {1, count + 1, entry_id}
"""
)

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
# Entries older than the queue timeout plus this are stale (the worker has dropped them at their deadline).
STALE_SLACK_S = 5.0


class Overloaded(ApiError):
    """The admission script refused the request and wrote nothing: the queue is full (503) or the caller holds
    its share of it (429)."""


def _counted_pairs(fields: Mapping[str, str]) -> list[str | int]:
    """A field map as script ARGV: its size, then names and values alternating (no text is ever spliced)."""
    args: list[str | int] = [len(fields)]
    for name, value in fields.items():
        args += (name, value)
    return args


class Admission:
    """Queue cap and rate limits of one replica (state in Redis)."""

    def __init__(self, redis: Redis, keys: ApiKeys, settings: ApiSettings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._admit = redis.register_script(_ADMIT)
        self._admit_and_enqueue = redis.register_script(_ADMIT_AND_ENQUEUE)
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

    async def admit(self, request_id: str, prompt_tokens: int, owner: str) -> None:
        """Put `owner`'s request in the bounded queue, or raise Overloaded (with Retry-After) when it is full (503)
        or `owner` holds its share of it (429)."""
        try:
            result = await self._admit(
                keys=[self.keys.queue, self.keys.queue_tokens, self.keys.queue_owners],
                args=self._queue_args(request_id, prompt_tokens, owner),
            )
        finally:
            admission_answered()
        if int(result[0]) != 1:
            raise self._refusal(result)

    async def admit_and_enqueue(
        self,
        request_id: str,
        prompt_tokens: int,
        owner: str,
        meta_key: str,
        meta_fields: Mapping[str, str],
        ttl_s: int,
        stream: str,
        message_fields: Mapping[str, str],
    ) -> str:
        """`admit`, and only if admitted, in the same atomic script: HSET `meta_key` (expiring after
        `ttl_s`) and XADD `message_fields` to `stream`. Returns the stream entry id; raises Overloaded
        (nothing written) when refused."""
        try:
            result = await self._admit_and_enqueue(
                keys=[self.keys.queue, self.keys.queue_tokens, self.keys.queue_owners, meta_key, stream],
                args=[
                    *self._queue_args(request_id, prompt_tokens, owner),
                    ttl_s,
                    *_counted_pairs(meta_fields),
                    *_counted_pairs(message_fields),
                ],
            )
        finally:
            admission_answered()
        if int(result[0]) != 1:
            raise self._refusal(result)
        return result[2]

    def _stale_before(self, now: float) -> float:
        """Entries admitted before this no longer count (their replica died; the worker drops them anyway)."""
        return now - self.settings.queue_timeout_s - STALE_SLACK_S

    def _queue_args(self, request_id: str, prompt_tokens: int, owner: str) -> list[str | int | float]:
        """_QUEUE_ADMIT's ARGV."""
        s = self.settings
        now = time.time()
        # Without auth, or with one key, every request is the same caller: only the cap applies.
        max_per_owner = s.max_queued_per_key if len(s.api_keys) > 1 else 0
        return [now, self._stale_before(now), s.max_queued_requests, s.max_queued_prompt_tokens, request_id,
                prompt_tokens, owner, max_per_owner]  # fmt: skip

    def _refusal(self, result: list) -> Overloaded:
        s = self.settings
        kind, current = result[1], int(result[2])
        if kind == "requests":
            return self.overloaded(current)
        if kind == "owner":
            return Overloaded(
                429,
                f"this API key has {current} requests queued, its share of the queue ({s.max_queued_per_key} of "
                f"{s.max_queued_requests}, INFERQ_MAX_QUEUED_PER_KEY_FRACTION); retry after "
                f"{s.overload_retry_after_s} s",
                type=RATE_LIMIT,
                code="queue_share_exceeded",
                headers={"Retry-After": str(s.overload_retry_after_s)},
            )
        return self._server_overloaded(f"{current} prompt tokens are queued (limit {s.max_queued_prompt_tokens})")

    def overloaded(self, queued: int) -> Overloaded:
        """The 503 of a full queue holding `queued` requests."""
        return self._server_overloaded(f"{queued} requests are queued (limit {self.settings.max_queued_requests})")

    def _server_overloaded(self, detail: str) -> Overloaded:
        s = self.settings
        return Overloaded(
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
            pipe.hdel(self.keys.queue_owners, request_id)
            await pipe.execute()

    async def live_queued(self) -> int:
        """Requests queued and not stale: one cheap read (ZCOUNT), for a refusal before a request is parsed
        (api/admission_gate.py); the admission script stays the exact check."""
        return await self.redis.zcount(self.keys.queue, f"({self._stale_before(time.time())}", "+inf")

    async def queued(self) -> tuple[int, int]:
        """(requests, prompt tokens) admitted and not yet started, across replicas."""
        count = await self.redis.zcard(self.keys.queue)
        tokens = sum(int(v) for v in await self.redis.hvals(self.keys.queue_tokens))
        return count, tokens
