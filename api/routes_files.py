"""OpenAI's Files API, for batch input: POST/GET /v1/files, GET/DELETE /v1/files/{id}, GET .../content.

Uploads are multipart (`file`, `purpose`), of purpose "batch" only, at most INFERQ_MAX_FILE_BYTES, and must
be JSONL (UTF-8 text with JSON objects on its lines; a single bad line is kept and becomes an error line
of the batch that runs it). A caller sees only the files it created (its API key).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from api import batch_listing
from api.auth import AuthorizedCaller
from api.batch_services import batch_services
from api.errors import ApiError, bad_request
from api.query_params import only_query_params
from api.responses import error_responses
from batch.file_store import BATCH
from batch.ids import new_file_id
from batch.input_lines import check_jsonl

router = APIRouter()


# A file the schema admits but that is not batch input: its content is not JSONL, or it is over the size limit.
INVALID_FILE_FORMAT = "invalid_file_format"
FILE_TOO_LARGE = "file_too_large"
FILE_LIMIT_CODES = (INVALID_FILE_FORMAT, FILE_TOO_LARGE)


def _upload_responses() -> dict:
    responses = error_responses(400, 401, 413)
    responses[400]["description"] = (
        "Invalid request: a form this document does not admit; or a file it cannot judge, answered with one of "
        "these codes: " + ", ".join(FILE_LIMIT_CODES) + " (not UTF-8 JSONL, over INFERQ_MAX_FILE_BYTES)"
    )
    return responses


def _not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such file: {file_id}", param="file_id", code="file_not_found")


async def _owned_file(services, file_id: str, caller) -> object:  # noqa: ANN001
    """The caller's file record; 404 for a file that does not exist or is another caller's."""
    record = await services.call(services.files.get, file_id, caller.owner)
    if record is None:
        raise _not_found(file_id)
    return record


@router.post("/v1/files", responses=_upload_responses())
async def create_file(
    request: Request,
    caller: AuthorizedCaller,
    file: Annotated[UploadFile, File(description="A JSONL file of batch requests.")],
    purpose: Annotated[Literal["batch"], Form(description='Only "batch".')],
) -> dict:
    services = batch_services(request)
    limit = services.settings.max_file_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        message = f"file: the file is larger than the limit of {limit} bytes (INFERQ_MAX_FILE_BYTES)"
        raise bad_request(message, param="file", code=FILE_TOO_LARGE)
    problem = await services.call(check_jsonl, data)  # a large file's decoding stays off the event loop
    if problem is not None:
        raise bad_request(f"file: {problem}", param="file", code=INVALID_FILE_FORMAT)
    filename = file.filename or "upload.jsonl"
    record = await services.call(services.files.write, new_file_id(), caller.owner, filename, BATCH, data)
    return record.openai()


@router.get(
    "/v1/files",
    responses=error_responses(400, 401),
    dependencies=[Depends(only_query_params("purpose", "limit", "after", "order"))],
)
async def list_files(
    request: Request,
    caller: AuthorizedCaller,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: Annotated[str | None, Query(max_length=128)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> dict:
    services = batch_services(request)
    records = await services.call(
        lambda: batch_listing.list_files(
            services.files, caller.owner, purpose, limit + 1, after, newest_first=order == "desc"
        )
    )
    data = [record.openai() for record in records[:limit]]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": len(records) > limit}


@router.get("/v1/files/{file_id}", responses=error_responses(401, 404))
async def retrieve_file(request: Request, caller: AuthorizedCaller, file_id: str) -> dict:
    record = await _owned_file(batch_services(request), file_id, caller)
    return record.openai()


@router.get("/v1/files/{file_id}/content", responses=error_responses(401, 404), response_class=Response)
async def file_content(request: Request, caller: AuthorizedCaller, file_id: str) -> Response:
    services = batch_services(request)
    await _owned_file(services, file_id, caller)
    try:
        data = await services.call(services.files.read, file_id)
    except FileNotFoundError:
        raise _not_found(file_id) from None
    return Response(data, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}", responses=error_responses(401, 404))
async def delete_file(request: Request, caller: AuthorizedCaller, file_id: str) -> dict:
    services = batch_services(request)
    record = await _owned_file(services, file_id, caller)
    await services.call(services.files.delete, file_id, record.owner)
    return {"id": file_id, "object": "file", "deleted": True}
