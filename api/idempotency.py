"""Idempotency-Key: a retried request attaches to the first one instead of generating twice.

The key is scoped to the caller (two callers may use the same key) and stored as
`{prefix}:api:idem:{owner}:{sha256(key)}` = "{request_id} {sha256(body)}" for the
result TTL. The body digest is over the parsed request (canonical JSON of the
validated fields), so whitespace or key order in the retry does not matter.

- same key, same body: the retry gets the first request's stream (or whole answer),
  replayed from the result stream, from any replica;
- same key, different body: 422 `idempotency_key_reused` (as the IETF draft and Stripe do).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pydantic import BaseModel
from redis.asyncio import Redis

from api.errors import ApiError
from api.keys import ApiKeys

MAX_KEY_CHARS = 256


@dataclass(frozen=True)
class IdempotencyClaim:
    """A key to claim: its Redis name and the digest of the body it belongs to."""

    redis_key: str
    body_digest: str


def body_digest(kind: str, body: BaseModel) -> str:
    canonical = json.dumps([kind, body.model_dump(mode="json")], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def make_claim(keys: ApiKeys, owner: str, header: str | None, kind: str, body: BaseModel) -> IdempotencyClaim | None:
    if header is None:
        return None
    if not 1 <= len(header) <= MAX_KEY_CHARS:
        raise ApiError(
            400,
            f"Idempotency-Key must hold 1 to {MAX_KEY_CHARS} characters, got {len(header)}",
            param="Idempotency-Key",
            code="invalid_idempotency_key",
        )
    key_digest = hashlib.sha256(header.encode("utf-8")).hexdigest()
    return IdempotencyClaim(keys.idempotency(owner, key_digest), body_digest(kind, body))


def _reused() -> ApiError:
    return ApiError(
        422,
        "this Idempotency-Key was already used with a different request body",
        param="Idempotency-Key",
        code="idempotency_key_reused",
    )


async def lookup(redis: Redis, claim: IdempotencyClaim) -> str | None:
    """The request id an earlier identical request got, or None if the key is new."""
    value = await redis.get(claim.redis_key)
    if value is None:
        return None
    request_id, digest = value.split(" ", 1)
    if digest != claim.body_digest:
        raise _reused()
    return request_id


async def bind(redis: Redis, claim: IdempotencyClaim, request_id: str, ttl_s: int) -> str | None:
    """Bind the key to `request_id`. Returns None if we won, else the winner's request id
    (a concurrent identical retry got there first)."""
    if await redis.set(claim.redis_key, f"{request_id} {claim.body_digest}", nx=True, ex=ttl_s):
        return None
    return await lookup(redis, claim)


async def forget(redis: Redis, claim: IdempotencyClaim, request_id: str) -> None:
    """Undo a claim whose request never reached the queue (so a retry may try again)."""
    value = await redis.get(claim.redis_key)
    if value is not None and value.split(" ", 1)[0] == request_id:
        await redis.delete(claim.redis_key)
