"""A batch's input file -> its lines: requests to run, or line errors in OpenAI's codes.

Each non-empty line of the file is one request, `{"custom_id", "method": "POST", "url", "body"}`; lines are
numbered from 1 as in an editor. A line that cannot be run becomes an error line of the batch's error file
and the others run. A body the API would refuse (its schema, its limits) is not an error here: it is sent
through the same validation as an HTTP request and answered with the same 400 (batch/line_requests.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_CUSTOM_ID_CHARS = 512

INVALID_JSON_LINE = "invalid_json_line"
MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
INVALID_URL = "invalid_url"
INVALID_METHOD = "invalid_method"
MISMATCHED_ENDPOINT = "mismatched_endpoint"
DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
INVALID_CUSTOM_ID = "invalid_custom_id"


@dataclass(frozen=True)
class InputLine:
    """A line to run."""

    line: int
    custom_id: str
    body: Any  # the JSON value of `body`, validated against the endpoint's schema when sent


@dataclass(frozen=True)
class LineError:
    """A line that is not run."""

    line: int
    custom_id: str | None
    code: str
    message: str


def _parse(line: int, text: str, endpoint: str) -> InputLine | LineError:
    try:
        item = json.loads(text)
    except ValueError as exc:
        return LineError(line, None, INVALID_JSON_LINE, f"line {line} is not valid JSON: {exc}")
    if not isinstance(item, dict):
        return LineError(line, None, INVALID_JSON_LINE, f"line {line} is not a JSON object")
    custom_id = item.get("custom_id")
    shown_id = custom_id if isinstance(custom_id, str) else None
    for name in ("custom_id", "method", "url", "body"):
        if name not in item:
            return LineError(line, shown_id, MISSING_REQUIRED_PARAMETER, f"line {line}: {name} is required")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        message = f"line {line}: custom_id must be a string of 1 to {MAX_CUSTOM_ID_CHARS} characters"
        return LineError(line, None, INVALID_CUSTOM_ID, message)
    if item["method"] != "POST":
        return LineError(line, custom_id, INVALID_METHOD, f"line {line}: method must be POST, got {item['method']!r}")
    url = item["url"]
    if url not in ENDPOINTS:
        message = f"line {line}: url must be one of {list(ENDPOINTS)}, got {url!r}"
        return LineError(line, custom_id, INVALID_URL, message)
    if url != endpoint:
        message = f"line {line}: url {url!r} is not the batch's endpoint {endpoint!r}"
        return LineError(line, custom_id, MISMATCHED_ENDPOINT, message)
    return InputLine(line, custom_id, item["body"])


def parse_lines(data: bytes, endpoint: str) -> list[InputLine | LineError]:
    """Every non-empty line of the file, in order; a custom_id seen before makes a later line an error."""
    out: list[InputLine | LineError] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if not raw.strip():
            continue
        parsed = _parse(number, raw, endpoint)
        if isinstance(parsed, InputLine):
            if parsed.custom_id in seen:
                message = f"line {number}: custom_id {parsed.custom_id!r} is used by an earlier line"
                parsed = LineError(number, parsed.custom_id, DUPLICATE_CUSTOM_ID, message)
            else:
                seen.add(parsed.custom_id)
        out.append(parsed)
    return out


def check_jsonl(data: bytes) -> str | None:
    """Why an upload is not a JSONL file of requests (None: it is). Single bad lines are kept: they become
    error lines of the batch; a file that is not UTF-8 text, or has no JSON object on any line, is refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the file is not UTF-8 text (byte {exc.start})"
    lines = [raw for raw in text.splitlines() if raw.strip()]
    if not lines:
        return "the file is empty"
    for raw in lines:
        try:
            if isinstance(json.loads(raw), dict):
                return None
        except ValueError:
            continue
    return "the file is not JSONL: no line is a JSON object"
