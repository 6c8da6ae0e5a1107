"""The Batch API's whole stack for tests: a real worker (SmolLM2 on CPU), the real API in a thread, and
Celery batch workers as child processes (`python -m batch`), all on the tests' private Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import openai
from openai.types import Batch

from api.settings import ApiSettings
from batch.settings import BatchSettings
from tests.api.processes import REPO_ROOT, one_thread_env
from tests.api.servers import API_KEY, ThreadApi
from tests.redis_server import RedisServer

# Short leases and sweeps: a runner that dies is replaced within a few seconds.
LEASE_S = 2.0
SWEEP_S = 0.5


def batch_settings(server: RedisServer, prefix: str, files_dir: Path, **overrides) -> BatchSettings:
    values = {
        "redis_url": server.url, "prefix": prefix, "files_dir": str(files_dir), "batch_lease_s": LEASE_S,
        "batch_sweep_interval_s": SWEEP_S, "max_file_bytes": 64 * 1024, "batch_in_flight": 32,
    }  # fmt: skip
    return BatchSettings(**{**values, **overrides})


class BatchWorkerProcess:
    """`python -m batch`: one Celery worker (solo pool) and its sweep thread."""

    def __init__(self, settings: BatchSettings, log_path: Path, name: str) -> None:
        env = {**one_thread_env()}
        for field, value in settings.model_dump().items():
            env[f"INFERQ_{field.upper()}"] = str(value)
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        args = [sys.executable, "-m", "batch", "--hostname", f"{name}@test", "--loglevel", "INFO"]
        self.process = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """kill -9: no goodbye, the message it held stays taken, its lease stays until it lapses."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self.log.closed:
            self.log.close()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def start_api(server: RedisServer, prefix: str, settings: BatchSettings) -> ThreadApi:
    api_settings = ApiSettings(redis_url=server.url, prefix=prefix, api_keys=[API_KEY], resume_grace_s=0.5)
    return ThreadApi(api_settings, settings).start()


def openai_client(api: ThreadApi) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def wait_batch(
    client: openai.OpenAI,
    batch_id: str,
    statuses: tuple[str, ...],
    timeout_s: float = 120,
    until: Callable[[Batch], bool] | None = None,
) -> Batch:
    """The batch once its status is one of `statuses` (or `until` holds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or (until is not None and until(batch)):
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} is still {batch.status} ({batch.request_counts})")
        time.sleep(0.1)
