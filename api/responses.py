"""Response bodies as pydantic models, for the OpenAPI document (what clients and the fuzzer read).

Routes build plain dicts (see openai_format.py); these models only describe them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


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


class AssistantMessage(BaseModel):
    role: str
    content: str


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


def completion_responses(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    ok = {
        200: {
            "model": model,
            "description": "The answer (JSON), or its SSE stream when stream is true",
            "content": _SSE,
        }
    }
    return ok | error_responses(400, 401, 404, 409, 413, 422, 429, 431, 499, 500, 503, 504)
