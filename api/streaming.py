"""Relaying a request's events to one client as OpenAI Server-Sent Events.

    id: 7
    data: {"id": "chatcmpl-...", "object": "chat.completion.chunk", ...}

Every event that comes from a result event carries its seq as the SSE `id`, so a client
that reconnects with `Last-Event-ID: 7` (or `?last_event_id=7`) gets exactly the events
after it, from any replica. The trailer (usage chunk when asked for, then `[DONE]`)
carries no id: per the SSE spec the last event id stays the last seq, and a reconnect
after the last seq gets just the trailer again.
A failure mid-stream is an error event in OpenAI's envelope, then `[DONE]`; so is a cancelled request
(`code: request_cancelled`): a client never sees a finish_reason OpenAI does not have.

Keep-alive: a stream that has sent nothing for `sse_ping_s` gets one comment line, `: ping`, with no
blank line after it. NOTE: both halves matter to the clients most users run. A comment followed by a
blank line (sse-starlette's own ping) makes the openai SDK's decoder dispatch an event there: the id
seen last is still set, so it yields an empty event and fails on its JSON (and so LangChain and LiteLLM,
which stream through it). And pings on a timer cut in while tokens flow; here they come only when the
stream is idle, written as raw bytes so that sse-starlette frames nothing around them
(docs/decisions/0046-sse-keep-alive.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from redis.exceptions import RedisError
from sse_starlette import EventSourceResponse

from api import attachments
from api.constraint_errors import constraint_failure, is_constraint_failure
from api.errors import INVALID_REQUEST, SERVER_ERROR, ApiError, error_body
from api.events import BrokenEventStream, EventSource, NotStarted
from api.logprob_format import token_texts
from api.metrics import RequestObserver
from api.openai_format import CANCELLED, OPENAI_FINISH_REASONS, ChunkFormatter, cancelled_message, usage_of
from api.request_meta import RequestMeta
from api.state import AppState
from api.structured_output import INVALID_CONSTRAINT
from worker.protocol import ResultEvent

log = logging.getLogger("inferq.api")

DONE = "[DONE]"
# A comment line alone: every SSE decoder skips it, and no blank line ends an event after it.
KEEP_ALIVE = b": ping\n"


def _error_event(message: str, code: str, event_id: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"data": json.dumps(error_body(message, type=SERVER_ERROR, code=code))}
    if event_id is not None:
        event["id"] = str(event_id)
    return event


def _end_event(meta: RequestMeta, event: ResultEvent) -> dict[str, Any]:
    """The error event that ends a stream at a failed or cancelled request (a result event of type "error", or
    of type "done" with a finish reason OpenAI's clients do not know)."""
    if event.type == "done" and event.finish_reason == CANCELLED:
        body = error_body(cancelled_message(meta.request_id), type=INVALID_REQUEST, code="request_cancelled")
        return {"id": str(event.seq), "data": json.dumps(body)}
    if is_constraint_failure(meta, event):
        return {"id": str(event.seq), "data": json.dumps(constraint_failure(meta, event).body())}
    return _error_event(event.error or "generation failed", "generation_error", event.seq)


def _redis_error_event(meta: RequestMeta, exc: RedisError) -> dict[str, Any]:
    message = (
        f"lost the queue (Redis): {exc}; the request goes on, resume it with Last-Event-ID at "
        f"/v1/requests/{meta.request_id}/stream"
    )
    return _error_event(message, "backend_unavailable")


async def relay(
    state: AppState,
    meta: RequestMeta,
    source: EventSource,
    *,
    resume_after: int = 0,
    observer: RequestObserver | None = None,
    release_admission: bool = False,
) -> AsyncIterator[dict[str, Any] | bytes]:
    """SSE events (sse-starlette dicts, and KEEP_ALIVE bytes while idle) for one client, from `source`
    (opened at seq 0).

    Events up to `resume_after` were delivered before: they only advance the formatter.
    """
    # NOTE: attach before anything slow (the first tokenizer load takes a while): a client that
    # re-attaches here within another replica's grace period must be counted in time.
    try:
        await attachments.attach(state, meta.request_id)
    except RedisError as exc:
        await source.close()
        yield _redis_error_event(meta, exc)
        yield {"data": DONE}
        return
    complete = False
    try:
        tokenizer = await state.tokenizers.get(state.redis)
        formatter = ChunkFormatter(meta, token_texts(tokenizer))
        started = False
        ended: str | None = None  # "error" or "abort": the stream ends with an error event
        async for event in source.events(idle_s=state.settings.sse_ping_s):
            if event is None:
                yield KEEP_ALIVE
                continue
            now = time.monotonic()
            if observer is not None:
                observer.on_event(event.type, len(event.token_ids or []), now)
            if event.type == "error" or (event.type == "done" and event.finish_reason not in OPENAI_FINISH_REASONS):
                ended = (event.finish_reason if event.type == "done" else None) or "error"
                if event.seq > resume_after:
                    yield _end_event(meta, event)
                break
            chunk = formatter.chunk(event)
            if event.seq > resume_after:
                yield {"id": str(event.seq), "data": json.dumps(chunk, ensure_ascii=False)}
            if not started:
                # NOTE: the request left the queue with its first event; its queue entry is released once
                # that event is on its way to the client, so the round trip is not on the path to the first
                # token (decision 0029). An error first: `_leave` releases it.
                started = True
                if release_admission:
                    await state.admission.release(meta.request_id)
        if ended is None and meta.include_usage:
            yield {"data": json.dumps(formatter.usage_chunk())}
        complete = True
        if observer is not None:
            reasons = [e.finish_reason or "error" for e in formatter.done] + ([ended] if ended else []) or ["error"]
            observer.on_finish(reasons, usage_of(formatter.done, meta, formatter.completion_tokens), time.monotonic())
        yield {"data": DONE}
    except NotStarted as exc:
        complete = True  # nothing to resume: we cancel it ourselves
        with anyio.CancelScope(shield=True):
            await attachments.cancel(state, meta.request_id)
        yield _error_event(f"the request was not started in time: {exc}", "queue_timeout")
        yield {"data": DONE}
    except BrokenEventStream as exc:
        complete = True
        log.error("request %s: %s", meta.request_id, exc)
        yield _error_event(f"the result stream is broken: {exc}", "broken_result_stream")
        yield {"data": DONE}
    except RedisError as exc:
        # The request goes on in the worker; the client may resume once Redis is back.
        log.warning("request %s: Redis failed mid-stream: %s", meta.request_id, exc)
        yield _redis_error_event(meta, exc)
        yield {"data": DONE}
    finally:
        with anyio.CancelScope(shield=True):
            await _leave(state, meta, source, complete, release_admission)


async def _leave(state: AppState, meta: RequestMeta, source: EventSource, complete: bool, release: bool) -> None:
    await source.close()
    try:
        if release:
            await state.admission.release(meta.request_id)
        remaining = await attachments.detach(state, meta.request_id)
    except Exception:
        log.warning("request %s: could not record the client leaving", meta.request_id, exc_info=True)
        return
    if not complete and remaining <= 0:
        attachments.cancel_after_grace(state, meta.request_id, meta.result_stream, meta.n)


async def held_until_first_event(
    events: AsyncIterator[dict[str, Any] | bytes],
) -> AsyncIterator[dict[str, Any] | bytes]:
    """`events` once their first one is known: a constraint the worker could not compile is raised as the 400
    it is (the response has not started), anything else starts the stream with it.

    NOTE: only a constrained stream waits (its worker compiles the constraint before its first token; the wait
    is the time to that token, which the client waits for anyway). A keep-alive first (a long queue) starts the
    stream: a failure after it is an SSE error event with the same envelope and code."""
    first = await anext(events)
    if isinstance(first, dict):
        error = json.loads(first.get("data", "null"))
        error = error.get("error") if isinstance(error, dict) else None
        if isinstance(error, dict) and error.get("code") == INVALID_CONSTRAINT:
            async for _ in events:  # runs the relay to its end: the request is over
                pass
            raise ApiError(400, error["message"], param=error.get("param"), code=INVALID_CONSTRAINT)

    async def started() -> AsyncIterator[dict[str, Any] | bytes]:
        yield first
        async for event in events:
            yield event

    return started()


def sse_response(state: AppState, meta: RequestMeta, events: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    return EventSourceResponse(
        events,
        ping=0,  # the relay writes its own keep-alives, only while idle (KEEP_ALIVE)
        sep="\n",
        headers={"X-Request-Id": meta.request_id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
