"""A running batch leaves the request stream nearly empty: its runner sends a line only while fewer than
`batch_queue_ahead` messages wait unread there (batch/stream_room.py), however many lines `batch_in_flight`
allows, so an interactive request never queues behind more than that many batch lines."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from batch.settings import BatchSettings
from tests.api.processes import SERVED, WorkerProcess
from tests.api.servers import ThreadApi
from tests.batch.stack import BatchWorkerProcess, openai_client, wait_batch
from tests.redis_server import RedisServer
from worker.protocol import Keys

LINES = 48
QUEUE_AHEAD = 2


class LagSampler:
    """The request stream's unread messages (the workers' group lag), sampled every few ms in a thread."""

    def __init__(self, server: RedisServer, prefix: str) -> None:
        self.client = server.client(decode_responses=True)
        self.keys = Keys(prefix)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            for group in self.client.xinfo_groups(self.keys.requests):
                if group["name"] == self.keys.group and group["lag"] is not None:
                    self.samples.append(int(group["lag"]))

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


def test_a_batch_keeps_no_more_than_its_queue_ahead_unread_in_the_stream(
    api: ThreadApi,
    worker: WorkerProcess,
    redis_server: RedisServer,
    prefix: str,
    settings: BatchSettings,
    tmp_path: Path,
) -> None:
    # in flight: every line at once, were the stream's room not the limit
    gated = settings.model_copy(update={"batch_in_flight": 1000, "batch_queue_ahead": QUEUE_AHEAD})
    batch_worker = BatchWorkerProcess(gated, tmp_path / "batch.log", "room")
    try:
        client = openai_client(api)
        lines = [
            {"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": SERVED, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 6}}
            for i in range(LINES)
        ]  # fmt: skip
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        upload = client.files.create(file=("in.jsonl", data), purpose="batch")
        with LagSampler(redis_server, prefix) as lag:
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = wait_batch(client, batch.id, ("completed", "failed"), timeout_s=180)
    finally:
        batch_worker.stop()
    assert done.status == "completed", batch_worker.tail()
    assert done.request_counts.completed == LINES
    assert len(lag.samples) > 100
    assert max(lag.samples) <= QUEUE_AHEAD, f"up to {max(lag.samples)} messages waited unread"
    assert max(lag.samples) >= 1  # the stream did hold lines the worker had not read: the bound was met, not idle
