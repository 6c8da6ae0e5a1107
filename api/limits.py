"""Checks that need the served model: prompt length against the context, max_tokens, token ids.

Messages name the field and both numbers, e.g. "prompt is 9000 tokens, but this model's
context (max_model_len) is 8192 tokens". Each refusal here has its own `code`: the published
schema cannot state these limits (they depend on the served model, or compare two fields by
value), and the OpenAPI document lists the codes instead (MODEL_LIMIT_CODES).
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import bad_request
from api.field_types import logit_bias_token
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.settings import ApiSettings
from api.structured_output import INVALID_CONSTRAINT
from api.tool_request import INVALID_TOOLS, UNKNOWN_TOOL
from worker.protocol import ModelInfo

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
OUTSIDE_VOCABULARY = "token_outside_vocabulary"
MIN_TOKENS_OVER_MAX_TOKENS = "min_tokens_over_max_tokens"
MAX_TOKENS_OVER_LIMIT = "max_tokens_over_limit"
# NOTE: with them, the refusals of a constraint or tools the document admits by shape but that are not valid
# (a schema that is no JSON Schema, a regex that does not compile, tool_choice naming no tool: api/output_plan.py).
MODEL_LIMIT_CODES = (
    CONTEXT_LENGTH_EXCEEDED,
    OUTSIDE_VOCABULARY,
    MIN_TOKENS_OVER_MAX_TOKENS,
    MAX_TOKENS_OVER_LIMIT,
    INVALID_CONSTRAINT,
    UNKNOWN_TOOL,
    INVALID_TOOLS,
)


@dataclass(frozen=True)
class Budget:
    prompt_tokens: int | None  # None: no tokenizer published yet, not checked here
    max_tokens: int


def check_token_ids(info: ModelInfo, body: ChatCompletionRequest | CompletionRequest) -> None:
    vocab = info.vocab_size
    if isinstance(body, CompletionRequest):
        prompt = body.single_prompt()
        if isinstance(prompt, list) and prompt and max(prompt) >= vocab:  # max() in C; the index only on error
            i = next(i for i, token in enumerate(prompt) if token >= vocab)
            raise bad_request(
                f"prompt[{i}] = {prompt[i]} is outside the vocabulary [0, {vocab})", param="prompt",
                code=OUTSIDE_VOCABULARY,
            )  # fmt: skip
    for key in body.logit_bias or {}:
        if logit_bias_token(key) >= vocab:
            raise bad_request(
                f"logit_bias key {key} is outside the vocabulary [0, {vocab})", param="logit_bias",
                code=OUTSIDE_VOCABULARY,
            )  # fmt: skip
    for token in body.stop_token_ids or []:
        if token >= vocab:
            raise bad_request(
                f"stop_token_ids: {token} is outside the vocabulary [0, {vocab})", param="stop_token_ids",
                code=OUTSIDE_VOCABULARY,
            )  # fmt: skip


def token_budget(
    info: ModelInfo, settings: ApiSettings, body: ChatCompletionRequest | CompletionRequest, prompt_tokens: int | None
) -> Budget:
    """Resolve max_tokens and check prompt + max_tokens against the context (as the engine will)."""
    context = info.max_model_len
    param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
    requested = body.requested_max_tokens()
    if prompt_tokens is not None and prompt_tokens >= context:
        prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise bad_request(
            f"{prompt_param}: the prompt is {prompt_tokens} tokens, but this model's context (max_model_len) is "
            f"{context} tokens; it must leave room for at least one output token",
            param=prompt_param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    if requested is not None:
        if settings.max_tokens_limit is not None and requested > settings.max_tokens_limit:
            raise bad_request(
                f"{param} is {requested}, over this server's limit of {settings.max_tokens_limit}", param=param,
                code=MAX_TOKENS_OVER_LIMIT,
            )  # fmt: skip
        if requested >= context:
            raise bad_request(
                f"{param} is {requested}, but this model's context (max_model_len) is {context} tokens",
                param=param,
                code=CONTEXT_LENGTH_EXCEEDED,
            )
        if prompt_tokens is not None and prompt_tokens + requested > context:
            raise bad_request(
                f"this model's context (max_model_len) is {context} tokens, but {prompt_tokens + requested} were "
                f"requested ({prompt_tokens} in the prompt, {requested} in {param}); lower {param} or the prompt",
                param=param,
                code=CONTEXT_LENGTH_EXCEEDED,
            )
        max_tokens = requested
    else:
        room = context - (prompt_tokens if prompt_tokens is not None else 1)
        if isinstance(body, CompletionRequest):
            default = settings.default_completion_max_tokens
        elif settings.default_max_tokens is not None:
            default = settings.default_max_tokens
        else:  # the model's own default (its generation_config's max_new_tokens, as vLLM takes it), or None
            default = info.default_max_tokens
        max_tokens = min(room, default) if default is not None else room
        if settings.max_tokens_limit is not None:
            max_tokens = min(max_tokens, settings.max_tokens_limit)
    if body.min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens ({body.min_tokens}) must be <= max_tokens ({max_tokens})", param="min_tokens",
            code=MIN_TOKENS_OVER_MAX_TOKENS,
        )  # fmt: skip
    return Budget(prompt_tokens=prompt_tokens, max_tokens=max_tokens)
