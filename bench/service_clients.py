"""The clients of bench/service_overhead.py: streaming POST /v1/completions with httpx, all at once
from several processes (so that the clients are not the bottleneck) or one at a time (TTFT at low load).

Only the arrival of the response headers, of the first token and the usage trailer are parsed.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time

SERVED_NAME = "bench"
CLIENT_PROCS = 4


def _usage_of(tail: bytes) -> dict | None:
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data:") and b'"usage"' in line:
            usage = json.loads(line[5:]).get("usage")
            if usage:
                return usage
    return None


def request_body(prompt: list[int], max_tokens: int) -> bytes:
    """A streaming completion of `max_tokens` tokens (ignore_eos, greedy, usage in the trailer), encoded."""
    return json.dumps({"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0.0,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip


async def _stream_one(client, base: str, prompt: list[int], max_tokens: int, body: bytes | None = None) -> dict:
    """One streaming completion; `body`: the request already encoded (else it is encoded here, on the clock)."""
    content = body if body is not None else request_body(prompt, max_tokens)
    start, first, tail = time.perf_counter(), None, b""
    async with client.stream(
        "POST", f"{base}/v1/completions", content=content, headers={"content-type": "application/json"}
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        headers = time.perf_counter()  # the request is admitted and queued in Redis
        # NOTE: only the arrival of the first token and the usage trailer are parsed, so that the
        # client's own CPU stays small next to the service's.
        async for chunk in response.aiter_raw():
            if first is None and b'"text"' in chunk:
                first = time.perf_counter()
            tail = (tail + chunk)[-8192:]
    end = time.perf_counter()
    if b'"error"' in tail:
        raise RuntimeError(f"stream ended with an error: {tail[-500:]!r}")
    usage = _usage_of(tail)
    if usage is None or usage["completion_tokens"] != max_tokens:
        raise RuntimeError(f"expected {max_tokens} tokens, usage says {usage}")
    return {"start": start, "headers": headers, "first": first, "end": end, "output_tokens": usage["completion_tokens"]}


async def _clients(base: str, jobs: list[tuple[list[int], int]], start_at: float, warm: bool) -> list[dict]:
    import httpx

    limits = httpx.Limits(max_connections=len(jobs) + 4, max_keepalive_connections=len(jobs) + 4)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0)) as client:
        bodies: list[bytes | None] = [None] * len(jobs)
        if warm:
            # A client that streams from a service keeps its connections open (keep-alive) and has its
            # request ready when it sends it; opening 64 connections and JSON-encoding 64 prompts of up
            # to 1024 ids at the same instant is this load generator's work, done here off the clock
            # (--cold-clients puts it back on: the runs before 2026-11-24 13:00 measured that way).
            await asyncio.gather(*(client.get(f"{base}/health") for _ in jobs))
            bodies = [request_body(p, n) for p, n in jobs]
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        return await asyncio.gather(*(_stream_one(client, base, p, n, b) for (p, n), b in zip(jobs, bodies)))


def _client_proc(base: str, jobs: list[tuple[list[int], int]], start_at: float, warm: bool) -> tuple[list[dict], float]:
    """One client process: its share of the clients; returns their timings and its CPU seconds."""
    rows = asyncio.run(_clients(base, jobs, start_at, warm))
    times = os.times()
    return rows, times.user + times.system


def sequential(base: str, prompts: list[list[int]], new_tokens: int) -> tuple[list[float], list[float]]:
    """One request at a time: (TTFT ms, ms until the response headers) of each."""

    async def run() -> list[dict]:
        import httpx

        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
            return [await _stream_one(client, base, p, new_tokens) for p in prompts]

    rows = asyncio.run(run())
    return [(r["first"] - r["start"]) * 1000 for r in rows], [(r["headers"] - r["start"]) * 1000 for r in rows]


def run_clients(
    bases: str | list[str], jobs: list[tuple[list[int], int]], warm: bool = True
) -> tuple[list[dict], float, float]:
    """All jobs at once from CLIENT_PROCS processes: (rows, the clients' CPU seconds, wall seconds).
    With several API replicas (bases), client process i talks to bases[i % len(bases)]. `warm`: each
    client opens its connection and encodes its request before the common start."""
    bases = [bases] if isinstance(bases, str) else bases
    shares = [jobs[i::CLIENT_PROCS] for i in range(CLIENT_PROCS)]
    start_at = time.perf_counter() + 2.0  # CLOCK_MONOTONIC: the same clock in every process
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(CLIENT_PROCS) as pool:
        parts = pool.starmap(
            _client_proc, [(bases[i % len(bases)], share, start_at, warm) for i, share in enumerate(shares) if share]
        )
    rows = [row for part, _ in parts for row in part]
    return rows, sum(cpu for _, cpu in parts), max(r["end"] for r in rows) - start_at
