"""The service under benchmark, as children of a Service (bench/service_processes.py): a private
redis-server run as `inferq up` runs it (AOF on, fsync every second; plus the slow log and latency monitor of
bench/redis_stalls.py), the worker (bench/service_overhead.py's
worker child: the offline benchmark's engine with random weights, warmed, handed to worker.loop.Worker) and
`python -m api` replicas. Shared by bench/service_overhead.py and bench/online_latency.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.offline_throughput import NUM_SEQS
from bench.redis_stalls import SERVER_ARGS as REDIS_STALL_ARGS
from bench.service_processes import STEM, Service, free_port, redis_server_binary, redis_server_libraries

# NOTE: under the burst each concurrent request may hold a pooled connection for a command (its pub/sub
# subscription is on the process's shared connection); a pool of redis-py's old default of 100 answered 503.
API_REDIS_MAX_CONNECTIONS = 4 * NUM_SEQS + 64


@dataclass
class Stack:
    service: Service  # check() raises if one of them exited
    redis: subprocess.Popen
    worker: subprocess.Popen
    apis: list[subprocess.Popen]
    bases: list[str]  # the API replicas' base URLs
    redis_url: str


@contextlib.contextmanager
def running_stack(
    out: Path,
    directory: Path,
    *,
    api_replicas: int,
    worker_flags: list[str],
    split: tuple[set[int], set[int]] | None = None,
    stem: str = STEM,
) -> Iterator[Stack]:
    """Starts redis-server (its data in a temporary folder), the worker and the API replicas, waits until every
    replica is ready, and stops them all and removes the folder on the way out. Logs: out/{stem}_{name}.log.

    worker_flags: more flags of the worker child (`bench.service_overhead --child worker`).
    split: (the worker's CPUs, everyone else's) to pin them apart, or None.
    """
    service, data_dir = Service(out, stem=stem), tempfile.mkdtemp(prefix="inferq-bench-redis-")
    try:
        yield _start(service, directory, data_dir, api_replicas, worker_flags, split)
    finally:
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _start(
    service: Service,
    directory: Path,
    data_dir: str,
    api_replicas: int,
    worker_flags: list[str],
    split: tuple[set[int], set[int]] | None,
) -> Stack:
    redis_port, api_ports = free_port(), [free_port() for _ in range(api_replicas)]
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    redis_env = redis_server_libraries()
    redis = service.start("redis", [redis_server_binary(), "--port", str(redis_port), "--bind", "127.0.0.1", "--dir",
                                    data_dir, "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                                    *REDIS_STALL_ARGS], redis_env)  # fmt: skip
    if split is not None:
        os.sched_setaffinity(0, split[0])  # the worker (and the publisher process it starts) inherit it
    worker = service.start("worker", [sys.executable, "-m", "bench.service_overhead", "--model-dir", str(directory),
                                      "--child", "worker", "--redis-url", redis_url, *worker_flags])  # fmt: skip
    if split is not None:
        os.sched_setaffinity(0, split[1])  # the API processes and the client processes inherit this
        os.sched_setaffinity(redis.pid, split[1])
    apis = [
        service.start(
            f"api{i}" if i else "api",
            [sys.executable, "-m", "api"],
            {
                "INFERQ_REDIS_URL": redis_url,
                "INFERQ_REDIS_MAX_CONNECTIONS": str(API_REDIS_MAX_CONNECTIONS),
                "INFERQ_HOST": "127.0.0.1",
                "INFERQ_PORT": str(port),
                "INFERQ_MAX_QUEUED_REQUESTS": str(4 * NUM_SEQS),
                "INFERQ_MAX_QUEUED_PROMPT_TOKENS": str(10**8),
            },
        )  # fmt: skip
        for i, port in enumerate(api_ports)
    ]
    bases = [f"http://127.0.0.1:{port}" for port in api_ports]
    for base in bases:
        service.wait_ready(base, 300)
    return Stack(service, redis, worker, apis, bases, redis_url)
