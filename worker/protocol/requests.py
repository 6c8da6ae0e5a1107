"""Request messages: what a submitter XADDs to `{prefix}:requests`, validated on decode."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.protocol.fields import _check_token_ids, _finite_float, _is_int, _load_json, _normalize
from worker.protocol.names import (
    MAX_REQUEST_ID_CHARS,
    MAX_RESULT_STREAM_CHARS,
    PROTOCOL_VERSION,
    REQUEST_ID_PATTERN,
    SAMPLING_PARAM_FIELDS,
    Keys,
    ProtocolError,
)


@dataclass
class RequestMessage:
    """One job, as submitted. Exactly one of prompt / messages / prompt_token_ids is set.

    `params` holds SamplingParams fields as plain JSON values (logit_bias keys become ints).
    `result_stream` is None for the default `Keys.result(id)`; use `result_stream_for(keys)`.
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

    def result_stream_for(self, keys: Keys) -> str:
        return self.result_stream or keys.result(self.id)


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
    return messages


def _check_params(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise ProtocolError("params", "must be a JSON object")
    unknown = sorted(set(params) - SAMPLING_PARAM_FIELDS)
    if unknown:
        raise ProtocolError(
            "params", f"unknown sampling parameter(s) {unknown}; allowed: {sorted(SAMPLING_PARAM_FIELDS)}"
        )
    params = dict(params)
    bias = params.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise ProtocolError("params.logit_bias", "must be an object of token id -> bias")
        try:
            params["logit_bias"] = {int(token): value for token, value in bias.items()}
        except ValueError:
            raise ProtocolError("params.logit_bias", "keys must be integer token ids") from None
    return params


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
    if not _is_int(message.priority):
        raise ProtocolError("priority", f"must be an integer, got {message.priority!r}")
    if message.result_stream is not None and not 0 < len(message.result_stream) <= MAX_RESULT_STREAM_CHARS:
        raise ProtocolError("result_stream", f"must hold 1 to {MAX_RESULT_STREAM_CHARS} characters")


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
    _validate_request(message)
    return message


def request_id_of(fields: Mapping[Any, Any]) -> str | None:
    """The message's id if it is a valid one, even when the rest is malformed (to answer the client)."""
    raw = _normalize(fields, errors="replace")
    request_id = raw.get("id")
    return request_id if isinstance(request_id, str) and REQUEST_ID_PATTERN.match(request_id) else None
