"""Response bodies as pydantic models, for the OpenAPI document (what clients and the fuzzer read),
and the corrections that make the document state what the API does.

Routes build plain dicts (see openai_format.py); these models only describe them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

REFS = "#/components/schemas/"  # where FastAPI puts the models' schemas


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CalledFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: str
    function: CalledFunction


class AssistantMessage(BaseModel):
    role: str
    content: str | None  # null when the answer is tool calls alone
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "inferq"
    max_model_len: int


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


class CancelResult(BaseModel):
    id: str
    object: str = "request.cancel"
    cancelled: bool


_SSE = {"text/event-stream": {"schema": {"type": "string"}}}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Invalid request",
        401: "Missing or wrong API key",
        404: "Not found",
        409: "Conflict",
        413: "Body too large",
        422: "Idempotency-Key reused with another body",
        429: "Rate limited",
        431: "Headers too large",
        499: "Client closed the request, or the request was cancelled",
        500: "Generation failed",
        503: "Overloaded, or no worker",
        504: "Timed out",
    }
    return {s: {"model": ErrorResponse, "description": descriptions.get(s, "Error")} for s in statuses}


def completion_responses(model: type[BaseModel], model_limit_codes: tuple[str, ...]) -> dict[int | str, dict[str, Any]]:
    ok = {
        200: {
            "model": model,
            "description": "The answer (JSON), or its SSE stream when stream is true",
            "content": _SSE,
        }
    }
    errors = error_responses(400, 401, 404, 409, 413, 422, 429, 431, 499, 500, 503, 504)
    errors[400]["description"] = (
        "Invalid request: a body this document does not admit; or one it admits that breaks a limit of the "
        "served model or a comparison between fields it cannot state, answered with one of these codes: "
        + ", ".join(model_limit_codes)
        + " (prompt + max_tokens over the context, a token id outside the vocabulary, min_tokens over max_tokens, "
        "max_tokens over the server's limit, a structured output constraint or tool parameters that are no valid "
        "JSON Schema or regex the grammar engine enforces, a tool_choice naming no tool)"
    )
    return ok | errors


def _validation_as_400(operation: dict[str, Any]) -> None:
    """FastAPI documents a 422 (its HTTPValidationError) on every route with parameters; inferq
    answers validation errors 400 in OpenAI's envelope (api/errors.py), and says so."""
    responses = operation.get("responses", {})
    fastapi_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if fastapi_422.get("$ref", "").endswith("/HTTPValidationError"):
        del responses["422"]
        envelope = {"application/json": {"schema": {"$ref": f"{REFS}ErrorResponse"}}}
        responses.setdefault("400", {"description": "Invalid request", "content": envelope})


def _without_null(parameter: dict[str, Any]) -> None:
    """An optional header or query parameter is absent or a string: never null, which FastAPI's
    schema of `str | None` admits (a fuzzer then sends the text "null")."""
    schema = parameter.get("schema", {})
    branches = schema.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        kept = [b for b in branches if b != {"type": "null"}]
        del schema["anyOf"]
        schema.update(kept[0] if len(kept) == 1 else {"anyOf": kept})


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _integer_bounds(schema: Any) -> None:
    """The bounds of every integer schema as JSON integers.

    NOTE: FastAPI's OpenAPI model holds bounds as floats; an integer field's bounds are integers
    that a float holds exactly (at most 2**53, or seed's 2**63), and some validators (jsonschema_rs,
    which schemathesis generates with) compare a large integer against a float bound wrongly."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            for key in _BOUNDS:
                value = schema.get(key)
                if isinstance(value, float) and value.is_integer():
                    schema[key] = int(value)
        for value in schema.values():
            _integer_bounds(value)
    elif isinstance(schema, list):
        for item in schema:
            _integer_bounds(item)


def publish_openapi_as_answered(app: FastAPI) -> None:
    """Make `app.openapi()` state what the API does: 400, not FastAPI's 422, for invalid input on every
    route; optional parameters that are absent or a value, never null; integer bounds as integers."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        for path in document.get("paths", {}).values():
            for operation in path.values():
                _validation_as_400(operation)
                for parameter in operation.get("parameters", []):
                    _without_null(parameter)
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        _integer_bounds(schemas)
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
