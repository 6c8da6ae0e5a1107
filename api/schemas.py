"""OpenAI request bodies for /v1/chat/completions and /v1/completions, validated.

Decisions (a vLLM/OpenAI user would expect these):
- Unknown fields are ignored, as OpenAI does. Fields of features inferq does not
  implement (tools, functions, response_format other than text, audio, suffix, ...)
  are rejected with a 400 that names the field, never silently dropped.
- Completions' `echo` returns the prompt before the output, with the prompt's logprobs
  when `logprobs` is set (the first token's null), as vLLM does; `max_tokens: 0` is allowed
  with echo only (lm-eval's log-likelihood requests: the prompt and its logprobs alone).
- Types are strict: "0.5" is not a temperature, true is not an integer.
- `prompt` is one prompt: a string, a list of token ids, or a list holding exactly one
  of those. Several prompts in one request are rejected (send one request per prompt).
- Limits that need the model (context length, vocabulary) are checked by the route
  once the model is known; everything else is checked here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from api.errors import FieldError
from api.unsupported import invalid_unicode_path, reject_unsupported

# NOTE: these mirror engine/sampling_params.py (the API may not import the engine); the
# engine checks them again, the API repeats them to answer 400 before anything is enqueued.
MAX_N = 16
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_SEED = 2**63 - 1
MAX_MESSAGES = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_PRIORITY = 2**31 - 1


def _finite(lo: float | None = None, hi: float | None = None, gt: float | None = None) -> Any:
    return Annotated[float, Strict(), Field(ge=lo, le=hi, gt=gt, allow_inf_nan=False)]


Temperature = _finite(0.0, 2.0)
Probability = _finite(0.0, 1.0)
Penalty = _finite(-2.0, 2.0)
StopString = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STOP_SEQUENCE_CHARS)]
TokenId = Annotated[StrictInt, Field(ge=0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields shared by chat and completion requests."""

    model_config = ConfigDict(extra="ignore")

    model: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Temperature | None = None  # type: ignore[valid-type]
    top_p: _finite(gt=0.0, hi=1.0) | None = None  # type: ignore[valid-type]
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Probability | None = None  # type: ignore[valid-type]
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    presence_penalty: Penalty | None = None  # type: ignore[valid-type]
    frequency_penalty: Penalty | None = None  # type: ignore[valid-type]
    repetition_penalty: _finite(gt=0.0, hi=10.0) | None = None  # type: ignore[valid-type]
    logit_bias: Annotated[dict[str, _finite(-100.0, 100.0)], Field(max_length=MAX_LOGIT_BIAS_ENTRIES)] | None = None  # type: ignore[valid-type]
    user: Annotated[StrictStr, Field(max_length=256)] | None = None
    ignore_eos: StrictBool = False
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    skip_special_tokens: StrictBool = True
    priority: Annotated[StrictInt, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    stream: StrictBool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = invalid_unicode_path(data, "")
        if where is not None:
            raise FieldError(where or "body", "strings must be valid Unicode (this one holds an unpaired surrogate)")
        return data

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"keys must be token ids (non-negative integers as strings), got {key!r}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def engine_params(self, max_tokens: int, logprobs: int | None) -> dict[str, Any]:
        """The protocol's `params` object (keys are the engine's SamplingParams fields)."""
        params: dict[str, Any] = {"n": self.n, "max_tokens": max_tokens}
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        if self.logit_bias:
            params["logit_bias"] = dict(self.logit_bias)
        if self.stop:
            params["stop"] = self.stop_list()
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.min_tokens:
            params["min_tokens"] = self.min_tokens
        if self.ignore_eos:
            params["ignore_eos"] = True
        if not self.skip_special_tokens:
            params["skip_special_tokens"] = False
        if logprobs is not None:
            params["logprobs"] = logprobs
        return params


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | Annotated[list[TextPart], Field(min_length=1)]
    name: Annotated[StrictStr, Field(max_length=256)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("role") in ("tool", "function"):
                raise FieldError("role", f"role '{data['role']}' is not supported (tools are not supported)")
            if data.get("tool_calls"):
                raise FieldError("tool_calls", "tool calls are not supported")
            content = data.get("content")
            if isinstance(content, list):
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind is not None and kind != "text":
                        raise FieldError("content", f"content parts of type {kind!r} are not supported, only 'text'")
        return data

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        return reject_unsupported(data, {})

    @model_validator(mode="after")
    def _logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs requires logprobs to be true")
        return self

    def echo_fields(self, max_tokens: int) -> dict[str, Any]:
        return {}  # chat has no echo

    def requested_max_tokens(self) -> int | None:
        # NOTE: max_completion_tokens is OpenAI's current name; it wins over the deprecated max_tokens.
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def wire_messages(self) -> list[dict[str, str]]:
        """Messages as the protocol carries them ({role, content} with text content).

        OpenAI's "developer" role is what open models' templates call "system".
        """
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


PromptText = Annotated[StrictStr, Field(min_length=1)]
PromptTokens = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    prompt: (
        PromptText
        | PromptTokens
        | Annotated[list[PromptText], Field(min_length=1, max_length=1)]
        | Annotated[list[PromptTokens], Field(min_length=1, max_length=1)]
    )
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None  # 0: with echo only (_echo)
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False
    best_of: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None
    suffix: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            prompt = data.get("prompt")
            if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
                raise FieldError("prompt", f"got {len(prompt)} prompts; send one prompt per request")
        return reject_unsupported(data, {"suffix": (None, "")})

    @model_validator(mode="after")
    def _best_of(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise FieldError("best_of", f"best_of ({self.best_of}) must equal n ({self.n}); it is not supported")
        return self

    @model_validator(mode="after")
    def _echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise FieldError(
                "max_tokens", "max_tokens must be at least 1; 0 is allowed only with echo (the prompt alone)"
            )
        return self

    def engine_params(self, max_tokens: int, logprobs: int | None) -> dict[str, Any]:
        # NOTE: echo with max_tokens 0 still generates one token, as vLLM does (the engine samples after any
        # prefill; the API does not show it, RequestMeta.echo_only); echo with logprobs asks for the prompt's.
        params = super().engine_params(max(max_tokens, 1), logprobs)
        if self.echo and logprobs is not None:
            params["prompt_logprobs"] = logprobs
        return params

    def echo_fields(self, max_tokens: int) -> dict[str, Any]:
        """RequestMeta's echo fields: the prompt as JSON, and whether the output is left out (max_tokens 0)."""
        if not self.echo:
            return {}
        return {"echo": json.dumps(self.single_prompt(), ensure_ascii=False), "echo_only": max_tokens == 0}

    def single_prompt(self) -> str | list[int]:
        """The one prompt, unwrapped from a one-element list."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def engine_logprobs(self) -> int | None:
        return self.logprobs
