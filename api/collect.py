"""A non-streamed answer: wait for every event of the request, answer one JSON body.

The wait is bounded by `request_timeout_s` (504, and the request is cancelled). A request cancelled meanwhile
(POST /v1/requests/{id}/cancel from another connection) answers 499 with code `request_cancelled`. A client
that hangs up while waiting cannot resume a response it never got the id of, so its
request is cancelled at once.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import Request

from api import attachments
from api.constraint_errors import constraint_failure, is_constraint_failure
from api.errors import SERVER_ERROR, ApiError
from api.events import BrokenEventStream, NotStarted
from api.logprob_format import token_texts
from api.openai_format import CANCELLED, OPENAI_FINISH_REASONS, WholeResponse, cancelled_message
from api.state import AppState
from api.submit import Accepted

DISCONNECT_POLL_S = 0.5


async def _collect(state: AppState, accepted: Accepted, answer: WholeResponse) -> None:
    observer = accepted.observer
    started = False
    async for event in accepted.source.events():
        if not started:
            started = True  # it left the queue: its admission slot is free for the next one
            if accepted.is_new:
                await state.admission.release(accepted.meta.request_id)
        if observer is not None:
            observer.on_event(event.type, len(event.token_ids or []), time.monotonic())
        if is_constraint_failure(accepted.meta, event):
            raise constraint_failure(accepted.meta, event)
        if event.type == "error" or (event.type == "done" and event.finish_reason not in OPENAI_FINISH_REASONS):
            if event.finish_reason == CANCELLED:
                raise ApiError(499, cancelled_message(accepted.meta.request_id), code="request_cancelled")
            error = event.error or f"finish_reason {event.finish_reason!r}"
            raise ApiError(500, f"generation failed: {error}", type=SERVER_ERROR, code="generation_error")
        answer.add(event)


async def _watch_disconnect(request: Request, scope: anyio.CancelScope, flag: list[bool]) -> None:
    while not await request.is_disconnected():
        await anyio.sleep(DISCONNECT_POLL_S)
    flag.append(True)
    scope.cancel()


async def collect(state: AppState, accepted: Accepted, request: Request) -> dict[str, Any]:
    meta = accepted.meta
    tokenizer = await state.tokenizers.get(state.redis)
    answer = WholeResponse(meta, token_texts(tokenizer))
    disconnected: list[bool] = []
    failure: Exception | None = None
    await attachments.attach(state, meta.request_id)
    try:
        with anyio.move_on_after(state.settings.request_timeout_s) as timeout:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_disconnect, request, tg.cancel_scope, disconnected)
                try:
                    await _collect(state, accepted, answer)
                except (ApiError, NotStarted, BrokenEventStream) as exc:
                    failure = exc  # kept out of the task group, which would wrap it in an ExceptionGroup
                finally:
                    tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await accepted.source.close()
            if accepted.is_new:
                await state.admission.release(meta.request_id)
            remaining = await attachments.detach(state, meta.request_id)
            if not accepted.source.complete and remaining <= 0:
                await attachments.cancel(state, meta.request_id)
    if isinstance(failure, NotStarted):
        raise ApiError(
            503,
            f"the request was not started in time: {failure}",
            type=SERVER_ERROR,
            code="queue_timeout",
            headers={"Retry-After": str(state.settings.overload_retry_after_s)},
        )
    if isinstance(failure, BrokenEventStream):
        raise ApiError(500, f"the result stream is broken: {failure}", type=SERVER_ERROR, code="broken_result_stream")
    if failure is not None:
        raise failure
    if timeout.cancelled_caught:
        raise ApiError(
            504,
            f"no complete answer within {state.settings.request_timeout_s:g} s; the request was "
            "cancelled (use stream=true for long generations)",
            type=SERVER_ERROR,
            code="timeout",
        )
    if disconnected:
        raise ApiError(499, "client closed the request", code="client_closed_request")
    body = answer.body()
    reasons = [c["finish_reason"] or "error" for c in body["choices"]]
    if accepted.observer is not None:
        accepted.observer.on_finish(reasons, body["usage"], time.monotonic())
    return body
