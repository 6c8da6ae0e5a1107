"""When a burst of long-prompt requests reaches Redis, by load generator: `python -m api` on a private
redis-server (no worker: each client stops at the response headers), N requests of 100-1024 random ids sent at
once from one process, by bench/socket_clients.py's clients or by httpx's (as bench/service_clients.py sends
them). Each message's arrival is its stream id's millisecond clock (Redis's), against the burst's start.

    python -m bench.burst_arrival --rounds 3

Why: the service benchmark compares the service with an offline engine that has every prompt at once; the time
a load generator takes to get its burst out is the generator's, not the service's (bench/socket_clients.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time

from bench.api_submit_latency import running_api
from bench.report import write_json
from bench.service_clients import request_body
from worker.protocol import Keys


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


async def _socket_burst(base: str, bodies: list[bytes]) -> float:
    from bench.socket_clients import open_connection, request_bytes

    connections = [await open_connection(base) for _ in bodies]
    requests = [request_bytes(base, b) for b in bodies]

    async def until_headers(connection, request: bytes) -> None:
        reader, writer = connection
        writer.write(request)
        seen = b""
        while b"\r\n\r\n" not in seen:
            seen += await reader.read(1 << 16)
        writer.close()

    started = time.time()
    await asyncio.gather(*(until_headers(c, r) for c, r in zip(connections, requests, strict=True)))
    return started


async def _httpx_burst(base: str, bodies: list[bytes]) -> float:
    import httpx

    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        await asyncio.gather(*(client.get(f"{base}/health") for _ in bodies))  # connections open before the start

        async def until_headers(body: bytes) -> None:
            headers = {"content-type": "application/json"}
            async with client.stream("POST", f"{base}/v1/completions", content=body, headers=headers):
                pass

        started = time.time()
        await asyncio.gather(*(until_headers(b) for b in bodies))
        return started


def main(argv=None) -> dict:
    args = _parse_args(argv)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 1000) for _ in range(rng.randint(100, 1024))] for _ in range(args.requests)]
    bodies = [request_body(p, 16) for p in prompts]
    rounds = []
    with running_api() as (base, client, _):
        stream = Keys("inferq").requests
        for _ in range(args.rounds):
            for kind, burst in (("httpx", _httpx_burst), ("socket", _socket_burst)):
                client.delete(stream)
                started = asyncio.run(burst(base, bodies))
                arrived = sorted(int(mid.split(b"-")[0]) / 1000 - started for mid, _ in client.xrange(stream))
                ms = [a * 1000 for a in arrived]
                rounds.append({"client": kind, "messages": len(ms), "first_ms": ms[0], "median_ms": ms[len(ms) // 2],
                               "last_ms": ms[-1]})  # fmt: skip
                print(json.dumps(rounds[-1]), flush=True)
    result = {"requests": args.requests, "cpus": os.cpu_count(), "rounds": rounds}
    write_json(args.out, "burst_arrival.json", result)
    return result


if __name__ == "__main__":
    main()
