"""The `structured_output` sampling parameter: exactly one of json / json_object / regex / choice / grammar,
checked with a message that names the field and the limit, and its canonical cache key."""

from __future__ import annotations

import json

# The same limits as worker/protocol/sampling_limits.py (the engine imports nothing from worker/;
# tests/worker/test_protocol.py holds the two equal).
STRUCTURED_OUTPUT_KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_STRUCTURED_OUTPUT_CHARS = 65_536
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024

FIELD = "structured_output"


def check_structured_output(value: object) -> None:
    """Raises ValueError naming `structured_output.<kind>` unless value is one well-formed constraint."""
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in STRUCTURED_OUTPUT_KINDS:
        raise ValueError(f"{FIELD} must be an object with exactly one of {list(STRUCTURED_OUTPUT_KINDS)}, got "
                         f"{str(value)[:80]!r}")  # fmt: skip
    kind, body = next(iter(value.items()))
    name = f"{FIELD}.{kind}"
    size = len(json.dumps(body, ensure_ascii=False))
    if size > MAX_STRUCTURED_OUTPUT_CHARS:
        raise ValueError(f"{name} may be at most {MAX_STRUCTURED_OUTPUT_CHARS} characters of JSON, got {size}")
    if kind == "json" and not isinstance(body, dict):
        raise ValueError(f"{name} must be a JSON Schema object, got {type(body).__name__}")
    if kind == "json_object" and body is not True:
        raise ValueError(f"{name} must be true, got {body!r}")
    if kind in ("regex", "grammar") and (not isinstance(body, str) or not body.strip()):
        raise ValueError(f"{name} must be a non-empty string")
    if kind == "choice":
        if not isinstance(body, list) or not 1 <= len(body) <= MAX_CHOICES:
            raise ValueError(f"{name} must be a list of 1 to {MAX_CHOICES} strings")
        for i, choice in enumerate(body):
            if not isinstance(choice, str) or not 1 <= len(choice) <= MAX_CHOICE_CHARS:
                raise ValueError(f"{name}[{i}] must be a string of 1 to {MAX_CHOICE_CHARS} characters")


def constraint_key(value: dict) -> tuple[str, str]:
    """(kind, canonical text): equal constraints (JSON keys in any order) share one compiled grammar."""
    kind, body = next(iter(value.items()))
    if isinstance(body, str):
        return kind, body
    return kind, json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
