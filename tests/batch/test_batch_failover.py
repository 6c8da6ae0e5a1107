"""kill -9 of the Celery batch worker and of the worker in the middle of a batch, new ones started: the
batch completes with every line answered exactly once."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from tests.api.processes import SERVED, WorkerProcess
from tests.api.servers import ThreadApi
from tests.batch.stack import BatchWorkerProcess, openai_client, wait_batch
from tests.redis_server import RedisServer

LINES = 96
# A held request is claimed by a live worker once idle this long (the dead one no longer renews it).
WORKER_LEASE_MS = "1500"


def _request(i: int) -> dict:
    body = {"model": SERVED, "prompt": f"Item {i}:", "max_tokens": 8, "temperature": 0.9, "seed": i}
    return {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body}


def test_killed_batch_worker_and_worker_lose_and_repeat_no_line(
    api: ThreadApi,
    worker: WorkerProcess,
    redis_server: RedisServer,
    prefix: str,
    start_batch_worker: Callable[..., BatchWorkerProcess],
    tmp_path: Path,
) -> None:
    client = openai_client(api)
    data = "".join(json.dumps(_request(i)) + "\n" for i in range(LINES)).encode()
    upload = client.files.create(file=("failover.jsonl", data), purpose="batch")
    first = start_batch_worker("first")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    progress = wait_batch(
        client, batch.id, ("completed",), timeout_s=60, until=lambda b: b.request_counts.completed >= 16
    )
    assert progress.status == "in_progress"

    # Both die at once, mid-batch: no goodbye from either.
    first.kill()
    os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    worker.log.close()
    rclient = redis_server.client(decode_responses=True)
    recorded = int(rclient.hget(f"{prefix}:batch:b:{batch.id}", "completed"))
    assert rclient.hlen(f"{prefix}:batch:sent:{batch.id}") > recorded  # lines were in flight

    replacement = WorkerProcess(
        redis_server, prefix, tmp_path / "worker2.log", extra_args=("--lease-ms", WORKER_LEASE_MS)
    )
    replacement.wait_ready(rclient, prefix)
    start_batch_worker("second")
    try:
        done = wait_batch(client, batch.id, ("completed", "failed"), timeout_s=120)
    finally:
        worker.process, worker.log = replacement.process, replacement.log  # the module's worker from now on
    assert done.status == "completed", done
    assert done.request_counts.total == LINES
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    custom_ids = [line["custom_id"] for line in output]
    assert sorted(custom_ids) == sorted(f"line-{i}" for i in range(LINES))  # each exactly once
    assert all(line["response"]["status_code"] == 200 for line in output)
    # The request ids sent: one message per line, none sent twice.
    requests = rclient.xrange(f"{prefix}:requests")
    ids = [fields["id"] for _, fields in requests if batch.id in fields["id"]]
    assert len(ids) == len(set(ids))
    rclient.close()
