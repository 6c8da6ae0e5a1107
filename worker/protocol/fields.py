"""Decoding helpers shared by the request and event schemas (stdlib only)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from worker.protocol.names import ProtocolError


def as_text(value: str | bytes, errors: str = "strict") -> str:
    """redis-py hands back bytes unless decode_responses=True: the text either way."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else value


def _normalize(fields: Mapping[Any, Any], errors: str = "strict") -> dict[str, str]:
    """redis-py hands back bytes unless decode_responses=True; accept both."""
    out = {}
    for key, value in fields.items():
        try:
            out[as_text(key, errors)] = as_text(value, errors)
        except UnicodeDecodeError:
            raise ProtocolError(as_text(key, "replace"), "is not valid UTF-8") from None
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


def _check_token_ids(name: str, token_ids: Any, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(token_ids, list) or (not token_ids and not allow_empty):
        raise ProtocolError(name, "must be a non-empty JSON list of integers")
    # NOTE: map/min run in C: a per-id Python check was half of a long prompt's decode, on the API's event loop
    # and again on the worker's loop thread (decision 0001).
    # type() is exact, so bool (an int subclass) is refused as before.
    if token_ids and (set(map(type, token_ids)) != {int} or min(token_ids) < 0):
        raise ProtocolError(name, "must hold only non-negative integers")
    return token_ids
