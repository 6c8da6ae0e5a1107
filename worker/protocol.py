"""The Redis wire contract between job submitters (the API, any other service) and workers.

Stdlib only: the API image imports this module without torch, the engine or even redis.
Every stream, group and key name lives in `Keys`; every message has a `v` version field.

Request stream `{prefix}:requests`, consumer group `{prefix}:workers`. A request message is a
flat map of strings (XADD fields) so that any language can submit:

    v="1", id=<[A-Za-z0-9._:-]{1,128}>,
    exactly one of prompt=<text> | messages=<JSON list of {role, content}> | prompt_token_ids=<JSON list of ints>,
    params=<JSON object of SamplingParams fields, optional>, priority=<int, optional, lower first>,
    deadline=<unix seconds, optional>, result_stream=<optional>, created=<unix seconds, optional>

Result stream (per request) `{prefix}:result:{id}`: events written ONLY with explicit ids "0-{seq}",
seq = 1, 2, 3, ...; Redis rejects an id equal to or below the last one, which is what makes a
resumed request's output exactly-once. Live copies of the same events go to the pub/sub channel
`{prefix}:events:{id}` as JSON objects.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "1"
DEFAULT_PREFIX = "inferq"
DEFAULT_RESULT_TTL_S = 3600  # result streams expire this long after their last write
DEFAULT_CANCEL_TTL_S = 3600
DEFAULT_HEARTBEAT_TTL_S = 10
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0

MAX_REQUEST_ID_CHARS = 128
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_RESULT_STREAM_CHARS = 512

# Keys of `params`: the engine's SamplingParams fields. Kept here (not imported) so the API
# can validate without the engine; a test checks both lists agree.
SAMPLING_PARAM_FIELDS = frozenset({
    "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logit_bias", "seed", "stop", "stop_token_ids", "max_tokens", "min_tokens", "ignore_eos", "logprobs",
    "skip_special_tokens",
})  # fmt: skip

EVENT_TYPES = ("token", "done", "error")
FINISH_REASONS = ("stop", "length", "abort", "error")


class ProtocolError(ValueError):
    """A message that breaks the contract. `field` names the offending field, `reason` says how."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


@dataclass(frozen=True)
class Keys:
    """Every Redis name inferq uses, derived from one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def requests(self) -> str:
        return f"{self.prefix}:requests"

    @property
    def group(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def model(self) -> str:
        return f"{self.prefix}:model"

    @property
    def worker_pattern(self) -> str:
        """SCAN MATCH pattern that finds every live worker's heartbeat key."""
        return f"{self.prefix}:worker:*"

    def result(self, request_id: str) -> str:
        return f"{self.prefix}:result:{request_id}"

    def events(self, request_id: str) -> str:
        return f"{self.prefix}:events:{request_id}"

    def cancel(self, request_id: str) -> str:
        return f"{self.prefix}:cancel:{request_id}"

    def worker(self, consumer: str) -> str:
        return f"{self.prefix}:worker:{consumer}"


def make_consumer_name() -> str:
    """A consumer name unique per process: hostname-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def stream_id(seq: int) -> str:
    """The explicit result-stream entry id of event `seq` (seq >= 1)."""
    return f"0-{seq}"


def seq_from_stream_id(entry_id: str | bytes) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1])


# ---- Requests ----------------------------------------------------------------------------------


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


def _text(value: str | bytes, errors: str = "strict") -> str:
    return value.decode("utf-8", errors) if isinstance(value, bytes) else value


def _normalize(fields: Mapping[Any, Any], errors: str = "strict") -> dict[str, str]:
    """redis-py hands back bytes unless decode_responses=True; accept both."""
    out = {}
    for key, value in fields.items():
        try:
            out[_text(key, errors)] = _text(value, errors)
        except UnicodeDecodeError:
            raise ProtocolError(_text(key, "replace"), "is not valid UTF-8") from None
    return out


def _load_json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(name, f"is not valid JSON ({exc.msg})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ProtocolError(name, f"must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(value):
        raise ProtocolError(name, f"must be finite, got {raw[:40]!r}")
    return value


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


def _check_token_ids(name: str, token_ids: Any, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(token_ids, list) or (not token_ids and not allow_empty):
        raise ProtocolError(name, "must be a non-empty JSON list of integers")
    if not all(_is_int(t) and t >= 0 for t in token_ids):
        raise ProtocolError(name, "must hold only non-negative integers")
    return token_ids


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


# ---- Result events -----------------------------------------------------------------------------


@dataclass
class ResultEvent:
    """One entry of a result stream (and one pub/sub message).

    type "token": `text` delta, `token_ids`, optional `logprobs`, for choice `index`.
    type "done": `finish_reason` and `usage` ({prompt_tokens, completion_tokens, total_tokens} of
        that choice; prompt_tokens is the request's prompt, counted once per choice) for choice `index`.
    type "error": `error` message; terminal for the whole request.
    `worker` names the consumer that wrote the event (an optional field, for auditing who ran what).
    """

    seq: int
    type: str
    index: int = 0
    text: str | None = None
    token_ids: list[int] | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    error: str | None = None
    worker: str | None = None

    @property
    def is_terminal_for_choice(self) -> bool:
        return self.type in ("done", "error")


def _validate_event(event: ResultEvent) -> None:
    if not _is_int(event.seq) or event.seq < 1:
        raise ProtocolError("seq", f"must be an integer >= 1, got {event.seq!r}")
    if event.type not in EVENT_TYPES:
        raise ProtocolError("type", f"must be one of {EVENT_TYPES}, got {event.type!r}")
    if not _is_int(event.index) or event.index < 0:
        raise ProtocolError("index", f"must be an integer >= 0, got {event.index!r}")
    if event.type == "done" and event.finish_reason not in FINISH_REASONS:
        raise ProtocolError("finish_reason", f"must be one of {FINISH_REASONS}, got {event.finish_reason!r}")
    if event.type == "error" and not event.error:
        raise ProtocolError("error", "an error event needs a message")


def _event_items(event: ResultEvent) -> dict[str, Any]:
    """The event's fields as JSON values, absent ones left out."""
    _validate_event(event)
    items: dict[str, Any] = {"v": PROTOCOL_VERSION, "seq": event.seq, "type": event.type, "index": event.index}
    if event.type == "token":
        items["text"] = event.text or ""
        items["token_ids"] = list(event.token_ids or [])
        if event.logprobs is not None:
            items["logprobs"] = event.logprobs
    elif event.type == "done":
        items["finish_reason"] = event.finish_reason
        if event.usage is not None:
            items["usage"] = event.usage
    else:
        items["error"] = event.error
    if event.worker is not None:
        items["worker"] = event.worker
    return items


_JSON_EVENT_FIELDS = ("token_ids", "logprobs", "usage")


def encode_event(event: ResultEvent) -> dict[str, str]:
    """XADD fields of an event (all strings; token_ids, logprobs and usage as JSON)."""
    fields = {}
    for name, value in _event_items(event).items():
        fields[name] = json.dumps(value, ensure_ascii=False) if name in _JSON_EVENT_FIELDS else str(value)
    return fields


def event_to_json(event: ResultEvent) -> str:
    """The pub/sub payload: one JSON object with the same keys, seq and index as ints."""
    return json.dumps(_event_items(event), ensure_ascii=False)


def decode_event(fields: Mapping[Any, Any] | str | bytes) -> ResultEvent:
    """Parse stream fields (str or bytes) or a pub/sub JSON payload.

    Raises:
        ProtocolError: naming the field that breaks the contract.
    """
    if isinstance(fields, (str, bytes)):
        items = _load_json("event", _text(fields))
        if not isinstance(items, dict):
            raise ProtocolError("event", "must be a JSON object")
    else:
        items = _normalize(fields)
        for name in _JSON_EVENT_FIELDS:
            if name in items:
                items[name] = _load_json(name, items[name])
    if str(items.get("v")) != PROTOCOL_VERSION:
        raise ProtocolError("v", f"must be {PROTOCOL_VERSION!r}, got {items.get('v')!r}")
    try:
        seq = int(items["seq"])
        index = int(items.get("index", 0))
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("seq", "seq and index must be integers") from None
    event = ResultEvent(
        seq=seq,
        type=items.get("type"),
        index=index,
        text=items.get("text"),
        token_ids=items.get("token_ids"),
        logprobs=items.get("logprobs"),
        finish_reason=items.get("finish_reason"),
        usage=items.get("usage"),
        error=items.get("error"),
        worker=items.get("worker"),
    )
    _validate_event(event)
    if event.token_ids is not None:
        _check_token_ids("token_ids", event.token_ids, allow_empty=True)
    return event


def is_complete(events: list[ResultEvent], n: int = 1) -> bool:
    """A result stream is complete when an error arrived or all n choices are done."""
    done = set()
    for event in events:
        if event.type == "error":
            return True
        if event.type == "done":
            done.add(event.index)
    return len(done) >= n


# ---- Dead letters, heartbeats, model info ------------------------------------------------------


def encode_dead_letter(
    request_id: str | None, reason: str, message_id: str, fields: Mapping[Any, Any]
) -> dict[str, str]:
    """XADD fields of a dead letter: the original message, why it was given up, and its stream id."""
    return {
        "v": PROTOCOL_VERSION,
        "id": request_id or "",
        "reason": reason,
        "message_id": _text(message_id),
        "fields": json.dumps(_normalize(fields, errors="replace"), ensure_ascii=False),
    }


class _JsonRecord:
    """to_json / from_json for the small JSON values below (unknown keys from newer workers are ignored)."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes):
        return cls(**{k: v for k, v in json.loads(raw).items() if k in cls.__dataclass_fields__})


@dataclass
class WorkerHeartbeat(_JsonRecord):
    """Value of `Keys.worker(consumer)`, refreshed every second with a short TTL."""

    consumer: str
    model: str
    max_model_len: int
    started: float
    ts: float
    running: int
    waiting: int
    free_kv_tokens: int


@dataclass
class ModelInfo(_JsonRecord):
    """Value of `Keys.model`: what the API needs to validate requests without the engine."""

    model: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
