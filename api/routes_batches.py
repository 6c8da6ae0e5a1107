"""OpenAI's Batch API: POST/GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.

A batch is a record in Redis and a task for the Celery workers (batch/): the route checks the request,
writes the record (status validating) and queues the task; the workers do the rest (docs/batches.md).
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from api import batch_listing
from api.auth import AuthorizedCaller
from api.batch_services import batch_services
from api.errors import ApiError, bad_request
from api.query_params import only_query_params
from api.responses import error_responses
from batch.batch_store import CANCELLED, CANCELLING, IN_PROGRESS, TERMINAL, VALIDATING, openai_batch
from batch.file_store import BATCH
from batch.ids import new_batch_id

router = APIRouter()

MAX_METADATA_PAIRS = 16
MetadataKey = Annotated[StrictStr, Field(max_length=64)]
MetadataValue = Annotated[StrictStr, Field(max_length=512)]


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Literal["24h"]
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA_PAIRS)] | None = None


# A request the schema admits that names a file this caller cannot run: no such file, or not batch input.
FILE_NOT_FOUND = "file_not_found"
NOT_BATCH_INPUT = "file_not_batch_input"
BATCH_LIMIT_CODES = (FILE_NOT_FOUND, NOT_BATCH_INPUT)


def _create_responses() -> dict:
    responses = error_responses(400, 401)
    responses[400]["description"] = (
        "Invalid request: a body this document does not admit; or an input_file_id it cannot judge, answered "
        "with one of these codes: " + ", ".join(BATCH_LIMIT_CODES) + " (no such file of this API key, a file "
        "whose purpose is not batch)"
    )
    return responses


def _not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"No such batch: {batch_id}", param="batch_id", code="batch_not_found")


@router.post("/v1/batches", responses=_create_responses())
async def create_batch(request: Request, caller: AuthorizedCaller, body: BatchCreateRequest) -> dict:
    services = batch_services(request)
    record = await services.call(services.files.get, body.input_file_id, caller.owner)
    if record is None:
        message = f"input_file_id: no such file: {body.input_file_id}"
        raise bad_request(message, param="input_file_id", code=FILE_NOT_FOUND)
    if record.purpose != BATCH:
        message = f"input_file_id: the file's purpose is {record.purpose!r}, not 'batch'"
        raise bad_request(message, param="input_file_id", code=NOT_BATCH_INPUT)
    batch_id = new_batch_id()
    fields = await services.call(
        lambda: services.batches.create(batch_id, caller.owner, body.endpoint, body.input_file_id, body.metadata)
    )
    await services.dispatch(batch_id)
    return openai_batch(fields)


@router.get("/v1/batches/{batch_id}", responses=error_responses(401, 404))
async def retrieve_batch(request: Request, caller: AuthorizedCaller, batch_id: str) -> dict:
    services = batch_services(request)
    fields = await services.call(services.batches.get, batch_id, caller.owner)
    if fields is None:
        raise _not_found(batch_id)
    return openai_batch(fields)


@router.get(
    "/v1/batches",
    responses=error_responses(400, 401),
    dependencies=[Depends(only_query_params("after", "limit"))],
)
async def list_batches(
    request: Request,
    caller: AuthorizedCaller,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict:
    services = batch_services(request)
    records = await services.call(batch_listing.list_batches, services.batches, caller.owner, limit + 1, after)
    data = [openai_batch(fields) for fields in records[:limit]]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": len(records) > limit}


@router.post("/v1/batches/{batch_id}/cancel", responses=error_responses(401, 404, 409))
async def cancel_batch(request: Request, caller: AuthorizedCaller, batch_id: str) -> dict:
    """Running lines are cancelled and new ones are not sent; the batch ends `cancelled` once its runner has
    collected what was in flight."""
    services = batch_services(request)
    fields = await services.call(services.batches.get, batch_id, caller.owner)
    if fields is None:
        raise _not_found(batch_id)
    now = str(int(time.time()))
    cancelled = await services.call(
        lambda: services.batches.transition(batch_id, (VALIDATING, IN_PROGRESS), status=CANCELLING, cancelling_at=now)
    )
    fields = await services.call(services.batches.get, batch_id, caller.owner)
    if fields is None:  # deleted meanwhile (the sweep)
        raise _not_found(batch_id)
    if not cancelled and fields["status"] in TERMINAL and fields["status"] != CANCELLED:
        message = f"batch {batch_id} is {fields['status']}; only a validating or in_progress batch can be cancelled"
        raise ApiError(409, message, param="batch_id", code="batch_not_cancellable")
    return openai_batch(fields)
