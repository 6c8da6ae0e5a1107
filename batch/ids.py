"""Identifiers. A line's request id is a function of (batch, line): a runner that replaces a dead one
sends nothing new for a line already sent, and finds its result stream by name."""

from __future__ import annotations

import uuid

from api.request_meta import CHAT


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def line_request_id(batch_id: str, line: int, kind: str) -> str:
    """The wire id (and the response body's `id`) of a batch line: [A-Za-z0-9._:-], at most 60 characters."""
    return f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{batch_id}-{line}"


def line_record_id(batch_id: str, line: int) -> str:
    """The `id` of a line in the output and error files."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


def output_file_id(batch_id: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-output"


def error_file_id(batch_id: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-errors"
