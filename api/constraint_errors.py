"""A constraint the worker could not compile (an unsupported construct, a grammar over its time limit):
the request ends with an error event before any token, and the client gets a 400 naming the field that
asked for it, as if the API had refused it, streamed or not (docs/decisions/0059-structured-output-api.md).

How the worker marks it (docs/protocol.md): an error event whose message starts with `structured_output`
(the params field it failed on), sent before any token event of the request.
"""

from __future__ import annotations

from api.errors import ApiError
from api.request_meta import RequestMeta
from api.structured_output import INVALID_CONSTRAINT
from worker.protocol import ResultEvent

WORKER_PREFIX = "structured_output"


def is_constraint_failure(meta: RequestMeta, event: ResultEvent) -> bool:
    return bool(meta.constraint_field) and event.type == "error" and (event.error or "").startswith(WORKER_PREFIX)


def constraint_failure(meta: RequestMeta, event: ResultEvent) -> ApiError:
    field = meta.constraint_field
    # The worker's message names its own field first ("structured_output.grammar: <why>"); the client's is named.
    message = event.error or ""
    reason = message.split(": ", 1)[1] if ": " in message else message.removeprefix(WORKER_PREFIX)
    return ApiError(400, f"{field}: the constraint does not compile: {reason}", param=field, code=INVALID_CONSTRAINT)
