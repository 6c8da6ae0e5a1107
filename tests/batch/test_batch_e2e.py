"""A batch through the openai SDK, end to end: the real API, real Celery batch workers, the real worker
(SmolLM2 on CPU), one private Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from tests.api.processes import SERVED
from tests.api.servers import ThreadApi
from tests.batch.stack import BatchWorkerProcess, openai_client, wait_batch

LINES = 200
MAX_TOKENS = 4
INTERACTIVE_CLIENTS = 32


def _body(i: int) -> dict:
    return {
        "model": SERVED,
        "messages": [{"role": "user", "content": f"Count to {i % 17}, then name a colour."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.8,
        "seed": 1000 + i,
    }


def _jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def _without_identity(body: dict) -> dict:
    """A body less what differs between two requests by construction: its id and its creation time."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def _lines(client: OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_through_the_openai_sdk_answers_every_line_once_as_the_api_would(
    api: ThreadApi, start_batch_worker: Callable[..., BatchWorkerProcess]
) -> None:
    start_batch_worker("batch1")
    client = openai_client(api)
    requests = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": _body(i)}
        for i in range(LINES)
    ]
    upload = client.files.create(file=("requests.jsonl", _jsonl(requests)), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == len(_jsonl(requests))
    assert client.files.retrieve(upload.id).filename == "requests.jsonl"
    started = time.monotonic()
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "e2e"}
    )
    assert batch.status == "validating" and batch.metadata == {"job": "e2e"}
    done = wait_batch(client, batch.id, ("completed", "failed"), timeout_s=240)
    took = time.monotonic() - started
    print(f"{LINES} lines in {took:.1f} s")  # 200 lines of 4 tokens: ~20 s on 2 CPU cores
    assert done.status == "completed", done
    assert done.request_counts.total == LINES
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0
    assert done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = _lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(r["custom_id"] for r in requests)
    # Every fourth request sent again interactively, with the same seed: the same body (all 200 agree too,
    # at 45 s more on 2 cores).
    compared = range(0, LINES, 4)
    with ThreadPoolExecutor(INTERACTIVE_CLIENTS) as pool:
        interactive = list(pool.map(lambda i: client.chat.completions.create(**_body(i)), compared))
    by_id = {line["custom_id"]: line for line in output}
    for i, answer in zip(compared, interactive, strict=True):
        line = by_id[f"req-{i}"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert _without_identity(body) == _without_identity(answer.model_dump(exclude_unset=True))
        assert body["id"] == line["response"]["request_id"]
    listed = client.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]
