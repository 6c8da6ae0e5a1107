"""Input files -> lines (pure): OpenAI's line error codes, duplicates, what an upload must be."""

from __future__ import annotations

import json

import pytest

from batch.input_lines import (
    DUPLICATE_CUSTOM_ID,
    INVALID_CUSTOM_ID,
    INVALID_JSON_LINE,
    INVALID_METHOD,
    INVALID_URL,
    MISMATCHED_ENDPOINT,
    MISSING_REQUIRED_PARAMETER,
    InputLine,
    LineError,
    check_jsonl,
    parse_lines,
)

CHAT = "/v1/chat/completions"


def _line(**fields) -> str:
    item = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": "m"}, **fields}
    return json.dumps({k: v for k, v in item.items() if v is not None})


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", INVALID_JSON_LINE),
        ("[1, 2]", INVALID_JSON_LINE),
        (_line(custom_id=None), MISSING_REQUIRED_PARAMETER),
        (_line(body=None), MISSING_REQUIRED_PARAMETER),
        (_line(custom_id=7), INVALID_CUSTOM_ID),
        (_line(custom_id=""), INVALID_CUSTOM_ID),
        (_line(method="GET"), INVALID_METHOD),
        (_line(url="/v1/embeddings"), INVALID_URL),
        (_line(url="/v1/completions"), MISMATCHED_ENDPOINT),
    ],
)
def test_a_line_that_cannot_run_is_an_error_with_openais_code(text: str, code: str) -> None:
    (parsed,) = parse_lines(text.encode(), CHAT)
    assert isinstance(parsed, LineError) and parsed.code == code and parsed.line == 1
    assert "line 1" in parsed.message


def test_lines_are_numbered_as_in_an_editor_blank_ones_skipped_and_a_repeated_custom_id_refused() -> None:
    data = "\n".join([_line(custom_id="x"), "", _line(custom_id="y"), _line(custom_id="x")]).encode()
    first, second, third = parse_lines(data, CHAT)
    assert first == InputLine(1, "x", {"model": "m"}) and second == InputLine(3, "y", {"model": "m"})
    assert isinstance(third, LineError) and (third.line, third.code, third.custom_id) == (4, DUPLICATE_CUSTOM_ID, "x")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"", "empty"),
        (b"\n \n", "empty"),
        (b"a,b,c\n1,2,3\n", "not JSONL"),
        (b"[1]\n", "not JSONL"),
    ],
)
def test_an_upload_must_be_jsonl(data: bytes, problem: str) -> None:
    assert problem in (check_jsonl(data) or "")


def test_an_upload_with_one_good_line_is_kept_for_its_bad_lines_to_be_reported() -> None:
    assert check_jsonl(b"{broken\n" + _line().encode() + b"\n") is None
