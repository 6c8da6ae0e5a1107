"""Result events: what a worker writes to a request's result stream (ids 0-seq) and channel."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.protocol.fields import _check_token_ids, _is_int, _load_json, _normalize, as_text
from worker.protocol.names import EVENT_TYPES, FINISH_REASONS, PROTOCOL_VERSION, ProtocolError


@dataclass(slots=True)
class ResultEvent:
    """One entry of a result stream (and one pub/sub message).

    type "token": `text` delta, `token_ids`, optional `logprobs`, for choice `index`; the choice's first token
        event of a request with `prompt_logprobs` also carries them: one entry per prompt token,
        {token_id, logprob, top}, the first with logprob null (nothing predicts it).
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
    prompt_logprobs: Any = None

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
        if event.prompt_logprobs is not None:
            items["prompt_logprobs"] = event.prompt_logprobs
    elif event.type == "done":
        items["finish_reason"] = event.finish_reason
        if event.usage is not None:
            items["usage"] = event.usage
    else:
        items["error"] = event.error
    if event.worker is not None:
        items["worker"] = event.worker
    return items


_JSON_EVENT_FIELDS = ("token_ids", "logprobs", "usage", "prompt_logprobs")
# One encoder for every event: json.dumps(..., ensure_ascii=False) builds a new JSONEncoder per call,
# a measurable share of a worker's time at one event per sequence per step.
_JSON = json.JSONEncoder(ensure_ascii=False)


def _fields_of(items: dict[str, Any]) -> dict[str, str]:
    return {name: _JSON.encode(value) if name in _JSON_EVENT_FIELDS else str(value) for name, value in items.items()}


def encode_event(event: ResultEvent) -> dict[str, str]:
    """XADD fields of an event (all strings; token_ids, logprobs, usage and prompt_logprobs as JSON)."""
    return _fields_of(_event_items(event))


def event_to_json(event: ResultEvent) -> str:
    """The pub/sub payload: one JSON object with the same keys, seq and index as ints."""
    return _JSON.encode(_event_items(event))


def encode_event_for_write(event: ResultEvent) -> tuple[dict[str, str], str]:
    """(XADD fields, pub/sub payload) of one event, validated once: what a worker writes per token."""
    items = _event_items(event)
    return _fields_of(items), _JSON.encode(items)


_VERSION_JSON = json.dumps(PROTOCOL_VERSION)


def encode_token_for_write(
    seq: int, index: int, text: str, token_ids: list[int], worker: str | None
) -> tuple[dict[str, str], str]:
    """encode_event_for_write of a token event without logprobs, from its values: the same fields and payload,
    byte for byte, without building the event or validating it (the worker numbers its own events: seq >= 1,
    index >= 0). NOTE: the publisher calls it for every token of every step, where the generic path (building
    the event, then encoding it) is a large share of the publisher's time an event (decision 0024)."""
    tokens = _JSON.encode(token_ids)
    text = text or ""
    fields = {"v": PROTOCOL_VERSION, "seq": str(seq), "type": "token", "index": str(index), "text": text,
              "token_ids": tokens}  # fmt: skip
    tail = ""
    if worker is not None:
        fields["worker"] = worker
        tail = f', "worker": {_JSON.encode(worker)}'
    payload = (f'{{"v": {_VERSION_JSON}, "seq": {seq}, "type": "token", "index": {index}, '
               f'"text": {_JSON.encode(text)}, "token_ids": {tokens}{tail}}}')  # fmt: skip
    return fields, payload


def decode_event(fields: Mapping[Any, Any] | str | bytes) -> ResultEvent:
    """Parse stream fields (str or bytes) or a pub/sub JSON payload.

    Raises:
        ProtocolError: naming the field that breaks the contract.
    """
    if isinstance(fields, (str, bytes)):
        items = _load_json("event", as_text(fields))
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
        prompt_logprobs=items.get("prompt_logprobs"),
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
