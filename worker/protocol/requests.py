"""Request messages: what a submitter XADDs to `{prefix}:requests`, validated on decode."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.protocol.constraints import check_structured_output, check_tools
from worker.protocol.fields import _check_token_ids, _finite_float, _load_json, _normalize
from worker.protocol.names import (
    MAX_REQUEST_ID_CHARS,
    MAX_RESULT_STREAM_CHARS,
    PROTOCOL_VERSION,
    REQUEST_ID_PATTERN,
    SAMPLING_PARAM_FIELDS,
    Keys,
    ProtocolError,
)
from worker.protocol.sampling_limits import (
    BOOLEAN_PARAMS,
    LOGIT_BIAS_LIMITS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_STOP_TOKEN_IDS,
    OPTIONAL_PARAMS,
    PRIORITY_LIMITS,
    SAMPLING_LIMITS,
    TOKEN_ID_LIMITS,
    param_error,
    range_error,
)


@dataclass
class RequestMessage:
    """One job, as submitted. Exactly one of prompt / messages / prompt_token_ids is set.

    `params` holds SamplingParams fields as plain JSON values (logit_bias keys become ints), each
    within worker/protocol/sampling_limits.py. `result_stream` may be left out: the result stream
    is always `Keys.result(id)`, and a worker dead-letters a message that names any other. `tools` (OpenAI
    tool objects) go to the chat template with `messages` (a prompt ignores them). `whole`: each choice's output
    comes as one token event when the choice ends, for a submitter that reads only whole answers.
    """

    id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    deadline: float | None = None
    result_stream: str | None = None
    created: float | None = None
    tools: list[dict[str, Any]] | None = None
    whole: bool = False

    def result_stream_for(self, keys: Keys) -> str:
        """The request's result stream: derived from its id, whatever the message names."""
        return keys.result(self.id)


def _check_request_id(request_id: Any) -> str:
    if not isinstance(request_id, str) or not REQUEST_ID_PATTERN.match(request_id):
        raise ProtocolError(
            "id",
            f"must match [A-Za-z0-9._:-] with 1 to {MAX_REQUEST_ID_CHARS} characters, got {str(request_id)[:40]!r}",
        )
    return request_id


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages", "must be a non-empty JSON list of {role, content} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ProtocolError(f"messages[{i}]", "must be an object with a string 'role'")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise ProtocolError(f"messages[{i}].content", "must be a string or null")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and (
            not isinstance(tool_calls, list) or not all(isinstance(call, dict) for call in tool_calls)
        ):
            raise ProtocolError(f"messages[{i}].tool_calls", "must be a list of tool call objects")
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise ProtocolError(f"messages[{i}].{key}", "must be a string")
    return messages


def _check_params(params: Any) -> dict[str, Any]:
    """The keys, and every value against worker/protocol/sampling_limits.py (the engine checks them again)."""
    if not isinstance(params, dict):
        raise ProtocolError("params", "must be a JSON object")
    unknown = sorted(set(params) - SAMPLING_PARAM_FIELDS)
    if unknown:
        raise ProtocolError(
            "params", f"unknown sampling parameter(s) {unknown}; allowed: {sorted(SAMPLING_PARAM_FIELDS)}"
        )
    params = dict(params)
    for name, value in params.items():
        if value is None and name in OPTIONAL_PARAMS:
            continue
        if name in SAMPLING_LIMITS:
            reason = param_error(name, value)
            if reason is not None:
                raise ProtocolError(f"params.{name}", reason)
    _check_relations(params)
    for name in BOOLEAN_PARAMS:
        if name in params and not isinstance(params[name], bool):
            raise ProtocolError(f"params.{name}", f"must be true or false, got {params[name]!r}")
    if "stop" in params:
        _check_stop(params["stop"])
    if "stop_token_ids" in params:
        params["stop_token_ids"] = _check_stop_token_ids(params["stop_token_ids"])
    if params.get("logit_bias") is not None:
        params["logit_bias"] = _check_logit_bias(params["logit_bias"])
    if params.get("structured_output") is not None:
        check_structured_output(params["structured_output"])
    return params


def _check_relations(params: dict[str, Any]) -> None:
    max_tokens, min_tokens = params.get("max_tokens"), params.get("min_tokens", 0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise ProtocolError("params.min_tokens", f"must be at most max_tokens ({max_tokens}), got {min_tokens}")


def _check_stop(stop: Any) -> None:
    if stop is None:
        return
    strings = [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, list) or len(strings) > MAX_STOP_SEQUENCES:
        raise ProtocolError("params.stop", f"must be a string or a list of at most {MAX_STOP_SEQUENCES} strings")
    for i, text in enumerate(strings):
        if not isinstance(text, str) or not 0 < len(text) <= MAX_STOP_SEQUENCE_CHARS:
            raise ProtocolError(f"params.stop[{i}]", f"must be a string of 1 to {MAX_STOP_SEQUENCE_CHARS} characters")


def _check_stop_token_ids(token_ids: Any) -> list[int]:
    if token_ids is None:
        return []
    if not isinstance(token_ids, list) or len(token_ids) > MAX_STOP_TOKEN_IDS:
        raise ProtocolError("params.stop_token_ids", f"must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
    low, high = TOKEN_ID_LIMITS
    for i, token in enumerate(token_ids):
        reason = range_error(token, low, high, integer=True)
        if reason is not None:
            raise ProtocolError(f"params.stop_token_ids[{i}]", reason)
    return token_ids


def _check_logit_bias(bias: Any) -> dict[int, float]:
    """JSON object keys are strings: they become int token ids here."""
    if not isinstance(bias, dict):
        raise ProtocolError("params.logit_bias", "must be an object of token id -> bias")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise ProtocolError("params.logit_bias", f"may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(bias)}")
    low, high = TOKEN_ID_LIMITS
    checked = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise ProtocolError("params.logit_bias", f"keys must be integer token ids, got {str(key)[:40]!r}") from None
        reason = range_error(token, low, high, integer=True)
        if reason is not None:
            raise ProtocolError("params.logit_bias", f"keys (token ids) {reason}")
        reason = range_error(value, *LOGIT_BIAS_LIMITS, integer=False)
        if reason is not None:
            raise ProtocolError(f"params.logit_bias[{token}]", reason)
        checked[token] = value
    return checked


def _validate_request(message: RequestMessage) -> None:
    _check_request_id(message.id)
    given = [name for name in ("prompt", "messages", "prompt_token_ids") if getattr(message, name) is not None]
    if len(given) != 1:
        raise ProtocolError("prompt", f"exactly one of prompt, messages, prompt_token_ids is required, got {given}")
    if message.prompt is not None and (not isinstance(message.prompt, str) or not message.prompt):
        raise ProtocolError("prompt", "must be a non-empty string")
    if message.messages is not None:
        _check_messages(message.messages)
    if message.prompt_token_ids is not None:
        _check_token_ids("prompt_token_ids", message.prompt_token_ids)
    _check_params(message.params)
    reason = range_error(message.priority, *PRIORITY_LIMITS, integer=True)
    if reason is not None:
        raise ProtocolError("priority", reason)
    if message.result_stream is not None and not 0 < len(message.result_stream) <= MAX_RESULT_STREAM_CHARS:
        raise ProtocolError("result_stream", f"must hold 1 to {MAX_RESULT_STREAM_CHARS} characters")
    if message.tools is not None:
        check_tools(message.tools)


def encode_request(message: RequestMessage) -> dict[str, str]:
    """XADD fields of a request (validated first; raises ProtocolError)."""
    _validate_request(message)
    fields = {"v": PROTOCOL_VERSION, "id": message.id}
    if message.prompt is not None:
        fields["prompt"] = message.prompt
    elif message.messages is not None:
        fields["messages"] = json.dumps(message.messages, ensure_ascii=False)
    else:
        fields["prompt_token_ids"] = json.dumps(message.prompt_token_ids)
    if message.params:
        fields["params"] = json.dumps(message.params, ensure_ascii=False)
    if message.priority:
        fields["priority"] = str(message.priority)
    if message.deadline is not None:
        fields["deadline"] = repr(float(message.deadline))
    if message.result_stream is not None:
        fields["result_stream"] = message.result_stream
    if message.created is not None:
        fields["created"] = repr(float(message.created))
    if message.tools is not None:
        fields["tools"] = json.dumps(message.tools, ensure_ascii=False)
    if message.whole:
        fields["whole"] = "1"
    return fields


def decode_request(fields: Mapping[Any, Any]) -> RequestMessage:
    """Parse and validate XADD fields (str or bytes). Unknown fields are ignored (newer senders).

    Raises:
        ProtocolError: naming the field that breaks the contract.
    """
    raw = _normalize(fields)
    version = raw.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("v", f"must be {PROTOCOL_VERSION!r}, got {version!r}")
    message = RequestMessage(id=_check_request_id(raw.get("id")))
    if "prompt" in raw:
        message.prompt = raw["prompt"]
    if "messages" in raw:
        message.messages = _check_messages(_load_json("messages", raw["messages"]))
    if "prompt_token_ids" in raw:
        message.prompt_token_ids = _check_token_ids(
            "prompt_token_ids", _load_json("prompt_token_ids", raw["prompt_token_ids"])
        )
    if "params" in raw:
        message.params = _check_params(_load_json("params", raw["params"]))
    if "priority" in raw:
        try:
            message.priority = int(raw["priority"])
        except ValueError:
            raise ProtocolError("priority", f"must be an integer, got {raw['priority'][:40]!r}") from None
    if "deadline" in raw:
        message.deadline = _finite_float("deadline", raw["deadline"])
    if "result_stream" in raw:
        message.result_stream = raw["result_stream"]
    if "created" in raw:
        message.created = _finite_float("created", raw["created"])
    if "tools" in raw:
        message.tools = check_tools(_load_json("tools", raw["tools"]))
    if "whole" in raw:
        if raw["whole"] not in ("0", "1"):
            raise ProtocolError("whole", f"must be 1 or 0, got {raw['whole'][:40]!r}")
        message.whole = raw["whole"] == "1"
    _validate_request(message)
    return message


def request_id_of(fields: Mapping[Any, Any]) -> str | None:
    """The message's id if it is a valid one, even when the rest is malformed (to answer the client)."""
    raw = _normalize(fields, errors="replace")
    request_id = raw.get("id")
    return request_id if isinstance(request_id, str) and REQUEST_ID_PATTERN.match(request_id) else None
