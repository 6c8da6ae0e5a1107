"""Fixtures of the Batch API tests: one private Redis, one real worker per module (SmolLM2 on CPU), the
real API, and Celery batch workers started as child processes."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from batch.settings import BatchSettings
from tests.api.processes import WorkerProcess
from tests.api.servers import ThreadApi
from tests.batch.stack import BatchWorkerProcess, batch_settings, start_api
from tests.redis_server import RedisServer, make_redis_fixture

redis_server = make_redis_fixture(scope="session")


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"b{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def settings(redis_server: RedisServer, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> BatchSettings:
    return batch_settings(redis_server, prefix, tmp_path_factory.mktemp("files"))


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """The real worker; a test that kills it starts another in its place (`worker.process` is replaced)."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    process = WorkerProcess(redis_server, prefix, log)
    client = redis_server.client(decode_responses=True)
    process.wait_ready(client, prefix)
    client.close()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, prefix: str, settings: BatchSettings, worker: WorkerProcess) -> Iterator[ThreadApi]:
    server = start_api(redis_server, prefix, settings)
    yield server
    server.stop()


@pytest.fixture
def start_batch_worker(settings: BatchSettings, tmp_path: Path) -> Iterator[Callable[..., BatchWorkerProcess]]:
    """Factory: start_batch_worker(name) -> a running `python -m batch` (stopped after the test)."""
    started: list[BatchWorkerProcess] = []

    def _start(name: str = "batch1") -> BatchWorkerProcess:
        process = BatchWorkerProcess(settings, tmp_path / f"{name}.log", name)
        started.append(process)
        return process

    yield _start
    for process in started:
        process.stop()
