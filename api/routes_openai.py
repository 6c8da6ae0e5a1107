"""OpenAI routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response

from api.auth import AuthorizedCaller, Caller
from api.collect import collect
from api.errors import ApiError
from api.limits import MODEL_LIMIT_CODES
from api.responses import ChatCompletion, Completion, ModelCard, ModelList, completion_responses, error_responses
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.state import AppState, app_state
from api.streaming import held_until_first_event, relay, sse_response
from api.submit import submit

router = APIRouter()

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description="Retry safely: same key and body, same answer.",
    ),
]


async def _answer(
    state: AppState,
    request: Request,
    caller: Caller,
    body: ChatCompletionRequest | CompletionRequest,
    idempotency_key: str | None,
) -> Response:
    accepted = await submit(state, caller, body, idempotency_key)
    if body.stream:
        events = relay(
            state, accepted.meta, accepted.source, observer=accepted.observer, release_admission=accepted.is_new
        )
        if accepted.meta.constraint_field:
            try:
                events = await held_until_first_event(events)
            except ApiError as err:
                err.headers.update({"X-Request-Id": accepted.meta.request_id})
                raise
        return sse_response(state, accepted.meta, events)
    request_id_header = {"X-Request-Id": accepted.meta.request_id}
    try:
        answer = await collect(state, accepted, request)
    except ApiError as err:
        err.headers.update(request_id_header)  # the request existed: say which one failed
        raise
    return JSONResponse(answer, headers=request_id_header)


@router.post(
    "/v1/chat/completions", responses=completion_responses(ChatCompletion, MODEL_LIMIT_CODES), response_model=None
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    caller: AuthorizedCaller,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    return await _answer(app_state(request), request, caller, body, idempotency_key)


@router.post("/v1/completions", responses=completion_responses(Completion, MODEL_LIMIT_CODES), response_model=None)
async def completions(
    body: CompletionRequest,
    request: Request,
    caller: AuthorizedCaller,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    return await _answer(app_state(request), request, caller, body, idempotency_key)


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401))
async def list_models(request: Request, _: AuthorizedCaller) -> ModelList:
    state = app_state(request)
    info = await state.models.info()
    if info is None:
        return ModelList(data=[])
    created = int(request.app.state.started)
    cards = [ModelCard(id=name, created=created, max_model_len=info.max_model_len) for name in state.models.names(info)]
    return ModelList(data=cards)
