"""Requests by id: resume a stream, cancel. Both only for the caller that created the request.

A request another caller owns answers 404, the same as one that does not exist, so ids
cannot be probed.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import Response

from api import attachments
from api.auth import AuthorizedCaller, Caller
from api.errors import ApiError
from api.request_meta import RequestMeta, load_meta
from api.responses import CancelResult, error_responses
from api.state import AppState, app_state
from api.streaming import relay, sse_response
from api.submit import START_SLACK_S, open_source
from worker.protocol import MAX_REQUEST_ID_CHARS

router = APIRouter()

RequestId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._:-]+$", max_length=MAX_REQUEST_ID_CHARS)]


async def _owned(state: AppState, request_id: str, caller: Caller) -> RequestMeta:
    meta = await load_meta(state.redis, state.keys, request_id)
    if meta is None or meta.owner != caller.owner:
        raise ApiError(
            404,
            f"no request '{request_id}' for this API key (unknown, expired or not yours)",
            param="id",
            code="request_not_found",
        )
    return meta


# A sequence number: at most 18 digits, so that every value the pattern admits is one the API takes.
LAST_EVENT_ID_PATTERN = r"^[0-9]{0,18}$"
LastEventIdHeader = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        pattern=LAST_EVENT_ID_PATTERN,
        description="The id of the last event received (a sequence number): resume after it.",
    ),
]


def _resume_after(header: str | None, query: int | None) -> int:
    if query is not None:
        return query
    return int(header) if header else 0


@router.get(
    "/v1/requests/{request_id}/stream",
    responses={200: {"description": "The remaining SSE events", "content": {"text/event-stream": {}}}}
    | error_responses(400, 401, 404),
    response_class=Response,
)
async def resume_stream(
    request_id: RequestId,
    request: Request,
    caller: AuthorizedCaller,
    last_event_id_header: LastEventIdHeader = None,
    last_event_id: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> Response:
    state = app_state(request)
    after = _resume_after(last_event_id_header, last_event_id)
    meta = await _owned(state, request_id, caller)
    # A request that never started gives up at the same time as on the replica that admitted it.
    start_left = meta.created + state.settings.queue_timeout_s + START_SLACK_S - time.time()
    source = await open_source(state, meta, start_timeout_s=max(0.0, start_left))
    return sse_response(state, meta, relay(state, meta, source, resume_after=after))


@router.post("/v1/requests/{request_id}/cancel", response_model=CancelResult, responses=error_responses(400, 401, 404))
async def cancel_request(request_id: RequestId, request: Request, caller: AuthorizedCaller) -> CancelResult:
    """Ask the worker to stop the request (its clients get a `request_cancelled` error); False if it had finished."""
    state = app_state(request)
    meta = await _owned(state, request_id, caller)
    if await attachments.is_finished(state, meta.result_stream, meta.n):
        return CancelResult(id=request_id, cancelled=False)
    await attachments.cancel(state, request_id)
    await state.admission.release(request_id)
    return CancelResult(id=request_id, cancelled=True)
