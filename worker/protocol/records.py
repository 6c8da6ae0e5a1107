"""Small JSON records kept in Redis: dead letters, worker heartbeats, model and tokenizer info."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.protocol.fields import _normalize, as_text
from worker.protocol.names import PROTOCOL_VERSION


def encode_dead_letter(
    request_id: str | None, reason: str, message_id: str, fields: Mapping[Any, Any]
) -> dict[str, str]:
    """XADD fields of a dead letter: the original message, why it was given up, and its stream id."""
    return {
        "v": PROTOCOL_VERSION,
        "id": request_id or "",
        "reason": reason,
        "message_id": as_text(message_id),
        "fields": json.dumps(_normalize(fields, errors="replace"), ensure_ascii=False),
    }


def _known_fields(cls: type, raw: str | bytes) -> dict[str, Any]:
    """A record's JSON as the dataclass's arguments: keys a newer worker added are ignored."""
    return {k: v for k, v in json.loads(raw).items() if k in cls.__dataclass_fields__}


@dataclass
class WorkerHeartbeat:
    """Value of `Keys.worker(consumer)`, refreshed every second with a short TTL."""

    consumer: str
    model: str
    max_model_len: int
    started: float
    ts: float
    running: int
    waiting: int
    free_kv_tokens: int
    # Its sequence slots (max_num_seqs): a Batch API runner sums them over the live workers to keep a batch
    # within what they can run (batch/stream_room.py). 0 in a record from a worker that predates the field.
    slots: int = 0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerHeartbeat:
        return cls(**_known_fields(cls, raw))


@dataclass
class ModelInfo:
    """Value of `Keys.model`: what the API needs to validate requests without the engine."""

    model: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    # The model's default max_tokens (its generation_config.json max_new_tokens), or None: the API's
    # default for a chat request that sets none, below its context room.
    default_max_tokens: int | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ModelInfo:
        return cls(**_known_fields(cls, raw))


def tokenizer_fields(tokenizer_json: str, chat_template: str, bos_token: str, eos_token: str) -> dict[str, str]:
    """HSET fields of `Keys.tokenizer`: the worker's tokenizer, so API replicas count prompt tokens
    without torch (the `tokenizers` library plus the chat template). `sha256` lets them reload only on change."""
    import hashlib

    return {
        "sha256": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
        "tokenizer_json": tokenizer_json,
        "chat_template": chat_template,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
