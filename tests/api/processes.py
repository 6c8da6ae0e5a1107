"""Child processes for the end-to-end tests: `python -m worker` and `python -m api`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.api.servers import API_KEY
from tests.redis_server import RedisServer, free_port
from worker.protocol import Keys

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED = "smollm2-test"
MAX_MODEL_LEN = 512
NUM_KV_TOKENS = 4096


def one_thread_env() -> dict[str, str]:
    # NOTE: on a 2-core box a 135M model decodes ~10x faster on one thread (no OpenMP contention).
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}


class WorkerProcess:
    def __init__(
        self,
        server: RedisServer,
        prefix: str,
        log_path: Path,
        model: str = "default",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """extra_args: more flags, after (so over) the ones here."""
        args = [
            sys.executable, "-m", "worker", "--model", model, "--served-model-name", SERVED,
            "--device", "cpu", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
            "--num-kv-tokens", str(NUM_KV_TOKENS), "--metrics-port", "0", "--batch-window-ms", "0",
            "--heartbeat-interval-s", "0.2", "--heartbeat-ttl-s", "2", "--redis-url", server.url, "--prefix", prefix,
            *extra_args,
        ]  # fmt: skip
        self.log_path = log_path
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            args, cwd=REPO_ROOT, env=one_thread_env(), stdout=self.log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, client, prefix: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not list(client.scan_iter(match=Keys(prefix).worker_pattern)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class ApiProcess:
    """`python -m api` as a child process: a second replica that shares nothing but Redis."""

    def __init__(self, server: RedisServer, prefix: str, log_path: Path) -> None:
        self.port = free_port()
        env = {
            **one_thread_env(), "INFERQ_REDIS_URL": server.url, "INFERQ_PREFIX": prefix, "INFERQ_API_KEYS": API_KEY,
            "INFERQ_HOST": "127.0.0.1", "INFERQ_PORT": str(self.port),
        }  # fmt: skip
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api"], cwd=REPO_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"python -m api did not start:\n{self.log_path.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=15)
        self.log.close()
