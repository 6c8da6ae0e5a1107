"""Lines of a batch's output and error files, in OpenAI's format:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}
    {"id": "batch_req_...", "custom_id": ..., "response": null, "error": {"code", "message"}}

A request that ran (or that the API would have answered with an error status) has a `response`; a line
that never became a request (bad JSON, an unknown url, a duplicate custom_id) or that the batch's
cancellation or expiry ended has an `error`. Lines with a 200 response go to the output file, every
other line to the error file.
"""

from __future__ import annotations

import json
from typing import Any

from batch.ids import line_record_id

BATCH_CANCELLED = "batch_cancelled"
BATCH_EXPIRED = "batch_expired"


def response_line(batch_id: str, line: int, custom_id: str, status: int, request_id: str | None, body: Any) -> str:
    response = {"status_code": status, "request_id": request_id, "body": body}
    item = {"id": line_record_id(batch_id, line), "custom_id": custom_id, "response": response, "error": None}
    return json.dumps(item, ensure_ascii=False)


def error_line(batch_id: str, line: int, custom_id: str | None, code: str, message: str) -> str:
    error = {"code": code, "message": message}
    item = {"id": line_record_id(batch_id, line), "custom_id": custom_id, "response": None, "error": error}
    return json.dumps(item, ensure_ascii=False)


def is_success(text: str) -> bool:
    response = json.loads(text).get("response")
    return response is not None and response.get("status_code") == 200
