"""OpenAI request bodies for /v1/chat/completions and /v1/completions, validated.

Decisions (a vLLM/OpenAI user would expect these):
- Unknown fields are ignored, as OpenAI does. Fields of features inferq does not
  implement (functions, audio, suffix, ...) are rejected with a 400 that names the field,
  never silently dropped. Structured output (response_format, structured_outputs, guided_*)
  is declared in api/structured_output.py, tools in api/tool_request.py.
- Completions' `echo` returns the prompt before the output, with the prompt's logprobs
  when `logprobs` is set (the first token's null), as vLLM does; completions' `max_tokens: 0`
  returns no output (with echo: the prompt and its logprobs alone, lm-eval's log-likelihood
  requests), as OpenAI's legacy completions do.
- Types are strict: "0.5" is not a temperature, true is not an integer. An integral
  float (5.0) is an integer, as JSON Schema and vLLM have it (api/field_types.py).
- Every number has both bounds, published in the OpenAPI document; so are the rules
  between fields (best_of equals n, top_logprobs needs logprobs, stream_options needs
  stream), so that a body the document admits is a body the API accepts, up to the
  limits of the served model.
- `prompt` is one prompt: a string, a list of token ids, or a list holding exactly one
  of those. Several prompts in one request are rejected (send one request per prompt).
- Limits that need the model (context length, vocabulary) are checked by the route
  once the model is known (api/limits.py); everything else is checked here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)

from api.chat_messages import ChatMessage
from api.errors import FieldError
from api.field_types import (
    GREEDY_BELOW_TEMPERATURE,
    LOGIT_BIAS_KEY,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_LOGPROBS,
    MAX_MESSAGES,
    MAX_N,
    MAX_PENALTY,
    MAX_PRIORITY,
    MAX_REPETITION_PENALTY,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    MAX_TOKEN_ID,
    MAX_TOOLS,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    SEED_BOUND,
    integer,
    logit_bias_token,
    number,
    token_ids,
)
from api.structured_output import ConstraintFields
from api.tool_request import Tool, ToolChoice
from api.unsupported import invalid_unicode_path, reject_unsupported, unsupported_properties

StopString = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STOP_SEQUENCE_CHARS)]
MaxTokens = integer(1, description="At least 1; prompt + max_tokens must fit the model's context (max_model_len).")
MinTokens = integer(0, description="At least 0 and at most max_tokens.")
CompletionMaxTokens = integer(
    0, description="0 returns no output (with echo: the prompt alone); prompt + max_tokens must fit max_model_len."
)
Temperature = number(
    0.0,
    MAX_TEMPERATURE,
    description=f"In [0, {MAX_TEMPERATURE:g}]. 0 is greedy; so is any temperature below "
    f"{GREEDY_BELOW_TEMPERATURE:g}, as in vLLM (dividing logits by it would overflow them).",
)
TopP = number(gt=0.0, hi=1.0, description="In (0, 1].")
TopK = integer(-1, MAX_TOP_K, description=f"In [-1, {MAX_TOP_K}]; -1 or 0 disables.")
MinP = number(0.0, 1.0, description="In [0, 1].")
Choices = integer(1, MAX_N, description=f"In [1, {MAX_N}].")
Seed = integer(0, lt=SEED_BOUND, description="In [0, 2**63 - 1].")
Penalty = number(-MAX_PENALTY, MAX_PENALTY, description=f"In [-{MAX_PENALTY:g}, {MAX_PENALTY:g}].")
RepetitionPenalty = number(
    MIN_REPETITION_PENALTY,
    MAX_REPETITION_PENALTY,
    description=f"In [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}]; 1 disables.",
)
LogitBias = Annotated[
    dict[str, number(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)],  # type: ignore[valid-type]
    Field(
        max_length=MAX_LOGIT_BIAS_ENTRIES,
        description=f"Token id (ASCII digits, in the vocabulary) -> bias in [-{MAX_LOGIT_BIAS:g}, "
        f"{MAX_LOGIT_BIAS:g}]; at most {MAX_LOGIT_BIAS_ENTRIES} entries.",
        json_schema_extra={"propertyNames": {"pattern": LOGIT_BIAS_KEY}},
    ),
]
StopTokenIds = token_ids(
    max_length=MAX_STOP_TOKEN_IDS, description=f"Token ids in [0, {MAX_TOKEN_ID}] and in the vocabulary."
)
Priority = integer(-MAX_PRIORITY, MAX_PRIORITY, description="In [-(2**31 - 1), 2**31 - 1].")
Logprobs = integer(0, MAX_LOGPROBS, description=f"In [0, {MAX_LOGPROBS}].")
TopLogprobs = integer(0, MAX_LOGPROBS, description=f"In [0, {MAX_LOGPROBS}]; only with logprobs true.")
BestOf = integer(1, MAX_N, description="Only equal to n (server-side best-of is not supported).")


def _requires(field: str, partner: str, value: Any) -> dict[str, Any]:
    """JSON Schema: when `field` is given (not null), `partner` must be `value`."""
    return {
        "anyOf": [
            {"properties": {field: {"type": "null"}}},  # also holds where `field` is absent
            {"properties": {partner: {"const": value}}, "required": [partner]},
        ]
    }


def _publish_rules(*rules: dict[str, Any], unsupported: dict[str, tuple[Any, ...]] | None = None) -> Any:
    """A model's json_schema_extra: the undeclared unsupported fields, and the rules between fields."""

    def extra(schema: dict[str, Any]) -> None:
        for name, prop in unsupported_properties(unsupported or {}).items():
            schema["properties"].setdefault(name, prop)
        if rules:
            schema["allOf"] = list(rules)

    return extra


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class SamplingFields(ConstraintFields):
    """Fields shared by chat and completion requests."""

    model_config = ConfigDict(extra="ignore")

    model: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    max_tokens: MaxTokens | None = None  # type: ignore[valid-type]
    temperature: Temperature | None = None  # type: ignore[valid-type]
    top_p: TopP | None = None  # type: ignore[valid-type]
    top_k: TopK | None = None  # type: ignore[valid-type]
    min_p: MinP | None = None  # type: ignore[valid-type]
    n: Choices = 1  # type: ignore[valid-type]
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stop_token_ids: StopTokenIds | None = None  # type: ignore[valid-type]
    seed: Seed | None = None  # type: ignore[valid-type]
    presence_penalty: Penalty | None = None  # type: ignore[valid-type]
    frequency_penalty: Penalty | None = None  # type: ignore[valid-type]
    repetition_penalty: RepetitionPenalty | None = None  # type: ignore[valid-type]
    logit_bias: LogitBias | None = None
    user: Annotated[StrictStr, Field(max_length=256)] | None = None
    ignore_eos: StrictBool = False
    min_tokens: MinTokens = 0  # type: ignore[valid-type]
    skip_special_tokens: StrictBool = True
    # false opts the request out of speculative decoding where the worker runs it (docs/speculative-decoding.md)
    speculative: StrictBool = True
    priority: Priority = 0  # type: ignore[valid-type]
    stream: StrictBool = False
    stream_options: StreamOptions | None = Field(None, description="Only when stream is true.")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = invalid_unicode_path(data, "")
        if where is not None:
            message = "strings and keys must be valid Unicode (this one holds an unpaired surrogate)"
            raise FieldError(where or "body", message)
        return data

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            logit_bias_token(key)
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

    def logit_bias_tokens(self) -> dict[int, float]:
        """logit_bias by token id (keys naming one token: the later one counts, as in vLLM)."""
        return {logit_bias_token(key): bias for key, bias in (self.logit_bias or {}).items()}

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
            params["logit_bias"] = {str(token): bias for token, bias in self.logit_bias_tokens().items()}
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
        if not self.speculative:
            params["speculative"] = False
        if logprobs is not None:
            params["logprobs"] = logprobs
        return params


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(
        json_schema_extra=_publish_rules(
            _requires("top_logprobs", "logprobs", True), _requires("stream_options", "stream", True)
        )
    )

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: MaxTokens | None = None  # type: ignore[valid-type]
    logprobs: StrictBool = False
    top_logprobs: TopLogprobs | None = None  # type: ignore[valid-type]
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = Field(None, description="Default: auto with tools, none without.")
    parallel_tool_calls: StrictBool = True

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

    def wire_messages(self) -> list[dict[str, Any]]:
        """Messages as the protocol carries them ({role, content} with text content, and tool calls)."""
        return [m.wire() for m in self.messages]


PromptText = Annotated[StrictStr, Field(min_length=1)]
PromptTokens = token_ids(min_length=1)


def _best_of_equals_n() -> dict[str, Any]:
    """JSON Schema: best_of absent, null, or equal to n (n defaults to 1).

    NOTE: one branch per n, not per best_of: schemathesis' canonicalizer gives up on the product of
    the per-best_of form with the stream_options rule (34 branches), and takes this one."""
    first = {"properties": {"n": {"const": 1}, "best_of": {"enum": [None, 1]}}}
    rest = [
        {"properties": {"n": {"const": k}, "best_of": {"enum": [None, k]}}, "required": ["n"]}
        for k in range(2, MAX_N + 1)
    ]
    return {"anyOf": [first, *rest]}


# NOTE: tools are a chat feature (the chat template renders them); a completion refuses them by name.
_COMPLETION_UNSUPPORTED: dict[str, tuple[Any, ...]] = {"tools": (None, []), "tool_choice": (None, "none")}


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(
        json_schema_extra=_publish_rules(
            _best_of_equals_n(), _requires("stream_options", "stream", True), unsupported=_COMPLETION_UNSUPPORTED
        )
    )

    prompt: (
        PromptText
        | PromptTokens  # type: ignore[valid-type]
        | Annotated[list[PromptText], Field(min_length=1, max_length=1)]
        | Annotated[list[PromptTokens], Field(min_length=1, max_length=1)]  # type: ignore[valid-type]
    )
    max_tokens: CompletionMaxTokens | None = None  # type: ignore[valid-type]
    logprobs: Logprobs | None = None  # type: ignore[valid-type]
    echo: StrictBool | None = Field(
        False, description="Return the prompt before the output (and its logprobs when logprobs is set)."
    )
    best_of: BestOf | None = None  # type: ignore[valid-type]
    suffix: Literal[""] | None = Field(None, description='Not supported: only "".')

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            prompt = data.get("prompt")
            if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
                raise FieldError("prompt", f"got {len(prompt)} prompts; send one prompt per request")
        return reject_unsupported(data, {"suffix": (None, ""), **_COMPLETION_UNSUPPORTED})

    @model_validator(mode="after")
    def _best_of(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise FieldError("best_of", f"best_of ({self.best_of}) must equal n ({self.n}); it is not supported")
        return self

    def engine_params(self, max_tokens: int, logprobs: int | None) -> dict[str, Any]:
        # NOTE: echo with max_tokens 0 still generates one token, as vLLM does (the engine samples after any
        # prefill; the API does not show it, RequestMeta.output_hidden); echo with logprobs asks for the prompt's.
        params = super().engine_params(max(max_tokens, 1), logprobs)
        if self.echo and logprobs is not None:
            params["prompt_logprobs"] = logprobs
        return params

    def echo_fields(self, max_tokens: int) -> dict[str, Any]:
        """RequestMeta's echo fields: the prompt as JSON, and whether the output is left out (max_tokens 0)."""
        fields: dict[str, Any] = {"output_hidden": max_tokens == 0}
        if self.echo:
            fields["echo"] = json.dumps(self.single_prompt(), ensure_ascii=False)
        return fields

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
