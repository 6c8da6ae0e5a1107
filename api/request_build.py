"""A validated completion body -> the request's meta (how its answer is formatted) and its wire message.

Pure: no Redis, no HTTP. The API's submit path and the batch runner (batch/line_requests.py) build their
requests here, so a batch line and the same body sent to /v1/chat/completions reach the worker as the same
message and are answered with the same body.
"""

from __future__ import annotations

from api.output_plan import NO_PLAN, OutputPlan
from api.request_meta import CHAT, COMPLETION, RequestMeta
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.tokens import PromptTokenizer
from worker.protocol import RequestMessage


def kind_of(body: ChatCompletionRequest | CompletionRequest) -> str:
    return CHAT if isinstance(body, ChatCompletionRequest) else COMPLETION


def prompt_token_count(
    tokenizer: PromptTokenizer | None, body: ChatCompletionRequest | CompletionRequest, tools: list | None = None
) -> int | None:
    """The prompt's tokens as the engine will count them; None when no tokenizer is published (not checked)."""
    if isinstance(body, CompletionRequest):
        prompt = body.single_prompt()
        if isinstance(prompt, list):
            return len(prompt)
        return None if tokenizer is None else tokenizer.count_text(prompt)
    return None if tokenizer is None else tokenizer.count_chat(body.wire_messages(), tools)


def _wire_prompt(body: ChatCompletionRequest | CompletionRequest) -> dict:
    if isinstance(body, ChatCompletionRequest):
        return {"messages": body.wire_messages()}
    prompt = body.single_prompt()
    return {"prompt_token_ids": prompt} if isinstance(prompt, list) else {"prompt": prompt}


def build_request(
    body: ChatCompletionRequest | CompletionRequest,
    *,
    request_id: str,
    owner: str,
    model_name: str,
    created: int,
    prompt_tokens: int,
    max_tokens: int,
    result_stream: str,
    priority: int,
    plan: OutputPlan = NO_PLAN,
) -> tuple[RequestMeta, RequestMessage]:
    """The request's meta and its message (deadline and created are stamped by the sender); `plan` carries the
    checked output constraint and tools (api/output_plan.py)."""
    meta = RequestMeta(
        request_id=request_id,
        owner=owner,
        kind=kind_of(body),
        model=model_name,
        created=created,
        n=body.n,
        include_usage=body.include_usage,
        logprobs=body.engine_logprobs(),
        prompt_tokens=prompt_tokens,
        result_stream=result_stream,
        **body.echo_fields(max_tokens),
        **plan.meta_fields(),
    )
    params = body.engine_params(max_tokens, body.engine_logprobs())
    if plan.constraint is not None:
        params["structured_output"] = plan.constraint
    message = RequestMessage(
        id=request_id,
        params=params,
        priority=priority,
        **_wire_prompt(body),
        **plan.message_fields(),
    )
    return meta, message
