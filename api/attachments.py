"""Who is listening to a request, across replicas, and cancelling it when nobody comes back.

A counter per request (`{prefix}:api:attached:{id}`) goes up when a client attaches
to its stream on any replica and down when it leaves. A client that leaves before the
request is complete starts a grace period (`resume_grace_s`): if the counter is still
zero at its end, the replica sets the wire cancel key and the worker aborts the
request and frees its KV blocks within a step or two.
NOTE: the grace timer lives in the replica that lost the client; if that replica dies
during the grace period the request runs to its end (bounded by max_tokens).
"""

from __future__ import annotations

import asyncio
import logging

from api.state import AppState
from worker.protocol import DEFAULT_CANCEL_TTL_S, ProtocolError, decode_event, is_complete

log = logging.getLogger("inferq.api")


async def attach(state: AppState, request_id: str) -> None:
    key = state.keys.attached(request_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expire(key, state.settings.result_ttl_s)
        await pipe.execute()


async def detach(state: AppState, request_id: str) -> int:
    """Returns how many clients are still attached."""
    return int(await state.redis.decr(state.keys.attached(request_id)))


async def cancel(state: AppState, request_id: str) -> None:
    """The cancel key, then the counter that tells workers to read cancel keys (worker/cancel.py)."""
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.set(state.keys.wire.cancel(request_id), "1", ex=DEFAULT_CANCEL_TTL_S)
        pipe.incr(state.keys.wire.cancels)
        await pipe.execute()


async def is_finished(state: AppState, result_stream: str, n: int) -> bool:
    """Whether the result stream holds the request's end (all n choices done, or an error)."""
    try:
        entries = await state.redis.xrange(result_stream, min="-", max="+")
        return is_complete([decode_event(fields) for _, fields in entries], n)
    except ProtocolError:
        return False


async def _cancel_unless_reattached(state: AppState, request_id: str, result_stream: str, n: int) -> None:
    await asyncio.sleep(state.settings.resume_grace_s)
    try:
        attached = int(await state.redis.get(state.keys.attached(request_id)) or 0)
        if attached <= 0 and not await is_finished(state, result_stream, n):
            log.info(
                "cancelling %s: its client left %.1f s ago and did not come back",
                request_id,
                state.settings.resume_grace_s,
            )
            await cancel(state, request_id)
    except Exception:
        log.warning("could not cancel %s after its client left", request_id, exc_info=True)


def cancel_after_grace(state: AppState, request_id: str, result_stream: str, n: int) -> None:
    state.spawn(_cancel_unless_reattached(state, request_id, result_stream, n))
