"""A batch line's body -> the request the API would send for it, or the error the API would answer.

The body goes through the API's own schema (api/schemas.py), model checks (api/model_info.py,
api/limits.py) and request building (api/request_build.py), so a line and the same body sent to the
HTTP route become the same wire message and are answered with the same body.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api.errors import bad_request, validation_error
from api.limits import check_token_ids, token_budget
from api.model_info import require_model
from api.output_plan import NO_PLAN, asks_for_output_checks, plan_output
from api.request_build import build_request, prompt_token_count
from api.request_meta import RequestMeta
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.settings import ApiSettings
from batch.served_model import ServedModel
from worker.protocol import Keys, RequestMessage

CHAT_ENDPOINT = "/v1/chat/completions"


def parse_body(endpoint: str, raw: Any) -> ChatCompletionRequest | CompletionRequest:
    """The body validated as the route validates it; ApiError (400 naming the field) when it is not valid."""
    schema = ChatCompletionRequest if endpoint == CHAT_ENDPOINT else CompletionRequest
    try:
        body = schema.model_validate(raw)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise validation_error(RequestValidationError(errors)) from None
    if body.stream:
        raise bad_request("stream: a batch line's answer is one body; stream must be false", param="stream")
    return body


def prepare(
    endpoint: str,
    raw: Any,
    *,
    request_id: str,
    owner: str,
    served: ServedModel,
    settings: ApiSettings,
    wire: Keys,
    priority: int,
) -> tuple[RequestMeta, RequestMessage]:
    """The line's request; raises ApiError with the status and body the API would answer."""
    body = parse_body(endpoint, raw)
    info, model_name = require_model(served.info, settings.served_model_name, body.model)
    check_token_ids(info, body)
    # structured output and tools are checked as the HTTP route checks them (api/output_plan.py)
    plan = plan_output(body, served.tokenizer, settings) if asks_for_output_checks(body) else NO_PLAN
    prompt_tokens = prompt_token_count(served.tokenizer, body, plan.tools.tools if plan.tools else None)
    budget = token_budget(info, settings, body, prompt_tokens)
    return build_request(
        body,
        request_id=request_id,
        owner=owner,
        model_name=model_name,
        created=int(time.time()),
        prompt_tokens=prompt_tokens if prompt_tokens is not None else 0,
        max_tokens=budget.max_tokens,
        result_stream=wire.result(request_id),
        priority=priority,
        plan=plan,
    )
