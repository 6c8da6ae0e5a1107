"""Every error the API answers, in OpenAI's envelope.

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

`ApiError` is raised anywhere in a route; the handlers registered by
`install_error_handlers` turn it, FastAPI's validation errors, Starlette's
404/405 and any unexpected exception into that envelope, so a client never
sees another shape (HTML, FastAPI's `{"detail": ...}`).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.responses import publish_openapi_as_answered

log = logging.getLogger("inferq.api")

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"


class FieldError(ValueError):
    """A validation failure that knows which request field it is about (it becomes `param`).

    `param` is relative to where pydantic reports the error (a message inside `messages`
    says "content"; the handler prefixes "messages[2]").
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class BodyTooLarge(Exception):
    """Raised while a body without Content-Length is read, once it passes the limit (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the limit of {limit} bytes")
        self.limit = limit


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"request body is larger than the limit of {limit} bytes (INFERQ_MAX_BODY_BYTES)", code="request_too_large"
    )


class ApiError(Exception):
    """An error answered to the client; the message names the field and the limit."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# Pydantic reports which branch of a union failed with tags like "constrained-str" or
# "list[int]" inside `loc`; they are not field names.
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
# Errors that only say "this union branch has another type"; a more specific error from the
# branch that matches the input's type is a better message.
_TYPE_MISMATCH = {
    "string_type",
    "int_type",
    "float_type",
    "bool_type",
    "list_type",
    "dict_type",
    "model_type",
    "model_attributes_type",
    "none_required",
    "int_from_float",
    "is_instance_of",
    "literal_error",
}


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or any(c in part for c in "[-("))


# Where FastAPI found a bad request parameter other than the body, as a message names it.
_PARAMETER_KINDS = {"header": "header", "query": "query parameter", "path": "path parameter"}


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; ('header', 'Idempotency-Key') -> itself."""
    if len(loc) > 1 and loc[0] in _PARAMETER_KINDS:
        return str(loc[1])  # a header's name as the client sends it: its '-' is no union tag
    out = ""
    for part in loc:
        if part == "body" and not out or _is_union_tag(part):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


def validation_error(exc: RequestValidationError) -> ApiError:
    """FastAPI/pydantic validation failure -> 400 naming the most specific bad field or parameter."""
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    # Stable sort: the first error that is more than a union branch's type mismatch wins.
    first = sorted(errors, key=lambda e: e.get("type") in _TYPE_MISMATCH)[0]
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return bad_request(f"request body is not valid JSON: {first.get('msg', '')}", code="invalid_json")
    param = _loc_to_param(loc)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is not None and loc and loc[0] in _PARAMETER_KINDS:
        return bad_request(f"{param} {_PARAMETER_KINDS[loc[0]]}: {msg}", param=param, code="invalid_value")
    field_error = (first.get("ctx") or {}).get("error")
    if isinstance(field_error, FieldError):
        param = f"{param}.{field_error.param}" if param else field_error.param
        return bad_request(f"{param}: {field_error.message}", param=param, code="invalid_value")
    if param is None:
        return bad_request(f"request body: {msg}", code="invalid_body")
    return bad_request(f"{param}: {msg}", param=param, code="invalid_value")


_STATUS_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 431: "headers_too_large"}


def install_error_handlers(app: FastAPI) -> None:
    publish_openapi_as_answered(app)  # the OpenAPI document says 400 where FastAPI's default says 422

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(BodyTooLarge)
    async def _body_too_large(_: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(body_too_large(exc.limit))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        if isinstance(cause, BaseExceptionGroup):  # a task group (a middleware's) read the body
            cause = next((e for e in cause.exceptions if isinstance(e, BodyTooLarge)), cause)
        if isinstance(cause, BodyTooLarge):  # FastAPI turns errors of reading the body into a 400
            return error_response(body_too_large(cause.limit))
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        err = ApiError(
            exc.status_code,
            message,
            type=SERVER_ERROR if exc.status_code >= 500 else INVALID_REQUEST,
            code=_STATUS_CODES.get(exc.status_code),
            headers=dict(exc.headers or {}),
        )
        return error_response(err)

    @app.exception_handler(RedisError)
    async def _redis_down(request: Request, exc: RedisError) -> JSONResponse:
        log.warning("Redis failed on %s %s: %s", request.method, request.url.path, exc)
        err = ApiError(
            503, f"the queue (Redis) is unavailable: {exc}", type=SERVER_ERROR, code="backend_unavailable",
            headers={"Retry-After": "1"},
        )  # fmt: skip
        return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ApiError(500, "internal server error", type=SERVER_ERROR, code="internal_error"))
