"""The API's own share of time to first token, without a worker or a GPU: how long `python -m api`
takes to answer a streaming completion with its headers (request validated, admitted, subscribed
to and queued in Redis), one request at a time and as a burst on one process.

    python -m bench.api_submit_latency                      # this tree
    python -m bench.api_submit_latency --tree /tmp/old      # another checkout's api/, same venv

A private redis-server holds a fake model record (no worker runs: the streams are closed right
after their headers). Prints and writes api_submit_latency.json into $OUT. The figures are the
machine's: on the 2-core dev box the clients, the API and Redis share two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import redis

from bench.report import write_json
from bench.service_processes import free_port, private_redis
from worker.protocol import Keys, ModelInfo

MODEL = "bench"
BODY = {"model": MODEL, "prompt": list(range(1, 129)), "max_tokens": 16, "stream": True}


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="checkout whose api/ runs")
    parser.add_argument("--sequential", type=int, default=150, help="requests one at a time")
    parser.add_argument("--burst", type=int, default=64, help="requests sent at once")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


async def _headers_ms(client: httpx.AsyncClient) -> tuple[float, float]:
    """(ms to the headers, perf_counter at the headers) of one streaming request."""
    start = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=BODY) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        at = time.perf_counter()
    return (at - start) * 1000, at


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(base: str, sequential: int, burst: int, api_pid: int) -> dict:
    limits = httpx.Limits(max_connections=burst + 4, max_keepalive_connections=burst + 4)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        for _ in range(10):  # warm-up: connections, the API's caches
            await _headers_ms(client)
        cpu_before = _cpu_seconds(api_pid)
        one_at_a_time = sorted([(await _headers_ms(client))[0] for _ in range(sequential)])
        # NOTE: the API's CPU per request is steadier than the latencies on a box whose cores the
        # client and Redis share with it; it includes closing each stream (no worker runs here).
        cpu_ms = (_cpu_seconds(api_pid) - cpu_before) * 1000 / sequential
        sent = time.perf_counter()
        answered = sorted(at - sent for _, at in await asyncio.gather(*(_headers_ms(client) for _ in range(burst))))
    return {
        "sequential_headers_ms": {"p10": one_at_a_time[len(one_at_a_time) // 10],
                                  "p50": statistics.median(one_at_a_time),
                                  "p90": one_at_a_time[9 * len(one_at_a_time) // 10]},
        "api_cpu_ms_per_sequential_request": cpu_ms,
        "burst": burst,
        "burst_headers_ms": {"first": answered[0] * 1000, "median": statistics.median(answered) * 1000,
                             "last": answered[-1] * 1000},
    }  # fmt: skip


@contextmanager
def running_api(tree: str | None = None) -> Iterator[tuple[str, redis.Redis, int]]:
    """`python -m api` (of `tree`'s checkout) on a private redis-server holding a fake model record, no
    worker: yields (the API's base URL, a client of that Redis (bytes replies), the API's pid)."""
    api_port = free_port()
    with private_redis() as redis_url:
        client = redis.Redis.from_url(redis_url)
        info = ModelInfo(model=MODEL, max_model_len=4096, vocab_size=1000, eos_token_ids=[0])
        client.set(Keys("inferq").model, info.to_json())
        env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "INFERQ_HOST": "127.0.0.1", "INFERQ_PORT": str(api_port),
               "INFERQ_MAX_QUEUED_REQUESTS": "100000"}  # fmt: skip
        api = subprocess.Popen([sys.executable, "-m", "api"], cwd=tree or str(Path(__file__).resolve().parents[1]),
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            base = f"http://127.0.0.1:{api_port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"{base}/health", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or api.poll() is not None:
                        raise SystemExit("the API did not start") from None
                    time.sleep(0.1)
            yield base, client, api.pid
        finally:
            api.terminate()
            api.wait(20)


def main(argv=None) -> dict:
    args = _parse_args(argv)
    with running_api(args.tree) as (base, _, api_pid):
        figures = asyncio.run(_measure(base, args.sequential, args.burst, api_pid))
    result = {"tree": args.tree, "cpus": os.cpu_count(), **figures}
    write_json(args.out, "api_submit_latency.json", result)
    return result


if __name__ == "__main__":
    main()
