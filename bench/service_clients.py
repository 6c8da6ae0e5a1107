"""The clients of bench/service_overhead.py: streaming POST /v1/completions, all at once from several
processes (so that the clients are not the bottleneck) or one at a time (TTFT at low load).

Two kinds: "socket" (the default, bench/socket_clients.py: one write a request, the response read as raw
bytes) and "httpx" (the load generator of the runs before 2026-11-27 05:00). Only the arrival of the response
headers, of the first token and the usage trailer are parsed.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time

SERVED_NAME = "bench"
CLIENT_PROCS = 4
CLIENT_KINDS = ("socket", "httpx")


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
    tokens = _checked_tokens(tail, max_tokens)
    return {"start": start, "headers": headers, "first": first, "end": end, "output_tokens": tokens}


def _checked_tokens(tail: bytes, max_tokens: int) -> int:
    """The completion tokens the usage trailer counts; raises on an error event or any other count."""
    if b'"error"' in tail:
        raise RuntimeError(f"stream ended with an error: {tail[-500:]!r}")
    usage = _usage_of(tail)
    if usage is None or usage["completion_tokens"] != max_tokens:
        raise RuntimeError(f"expected {max_tokens} tokens, usage says {usage}")
    return usage["completion_tokens"]


async def _socket_stream(base: str, request: bytes, max_tokens: int, connection=None) -> dict:
    """One streaming completion through bench/socket_clients.py (`connection`: opened before the clock)."""
    from bench.socket_clients import open_connection, stream_one

    times, status, payload = await stream_one(connection or await open_connection(base), request)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {payload[:300]!r}")
    return {**times, "output_tokens": _checked_tokens(payload[-8192:], max_tokens)}


async def _socket_clients(base: str, jobs: list[tuple[list[int], int]], start_at: float) -> list[dict]:
    from bench.socket_clients import open_connection, request_bytes

    connections = await asyncio.gather(*(open_connection(base) for _ in jobs))
    requests = [request_bytes(base, request_body(p, n)) for p, n in jobs]
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    return await asyncio.gather(
        *(_socket_stream(base, r, n, c) for r, (_, n), c in zip(requests, jobs, connections, strict=True))
    )


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


def _client_proc(
    base: str, jobs: list[tuple[list[int], int]], start_at: float, warm: bool, kind: str
) -> tuple[list[dict], float]:
    """One client process: its share of the clients; returns their timings and its CPU seconds."""
    clients = _socket_clients(base, jobs, start_at) if kind == "socket" else _clients(base, jobs, start_at, warm)
    rows = asyncio.run(clients)
    times = os.times()
    return rows, times.user + times.system


def sequential_rows(
    base: str, prompts: list[list[int]], new_tokens: int, kind: str = "socket", gap_s: float = 0.0
) -> list[dict]:
    """One request at a time (`gap_s` between them): each one's perf_counter times (start, headers, first, end)."""

    async def run() -> list[dict]:
        if kind == "socket":
            from bench.socket_clients import open_connection, request_bytes

            rows = []
            for p in prompts:  # each connection opened, and its request encoded, before its clock starts
                connection, request = await open_connection(base), request_bytes(base, request_body(p, new_tokens))
                rows.append(await _socket_stream(base, request, new_tokens, connection))
                await asyncio.sleep(gap_s)
            return rows
        import httpx

        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
            rows = []
            for p in prompts:
                rows.append(await _stream_one(client, base, p, new_tokens))
                await asyncio.sleep(gap_s)
            return rows

    return asyncio.run(run())


def sequential(
    base: str, prompts: list[list[int]], new_tokens: int, kind: str = "socket"
) -> tuple[list[float], list[float]]:
    """One request at a time: (TTFT ms, ms until the response headers) of each."""
    rows = sequential_rows(base, prompts, new_tokens, kind)
    return [(r["first"] - r["start"]) * 1000 for r in rows], [(r["headers"] - r["start"]) * 1000 for r in rows]


def run_clients(
    bases: str | list[str], jobs: list[tuple[list[int], int]], warm: bool = True, kind: str = "socket"
) -> tuple[list[dict], float, float]:
    """All jobs at once from CLIENT_PROCS processes: (rows, the clients' CPU seconds, wall seconds).
    With several API replicas (bases), client process i talks to bases[i % len(bases)]. `warm` (httpx; the
    socket clients always are): each client opens its connection and encodes its request before the common
    start."""
    bases = [bases] if isinstance(bases, str) else bases
    shares = [jobs[i::CLIENT_PROCS] for i in range(CLIENT_PROCS)]
    start_at = time.perf_counter() + 2.0  # CLOCK_MONOTONIC: the same clock in every process
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(CLIENT_PROCS) as pool:
        parts = pool.starmap(
            _client_proc,
            [(bases[i % len(bases)], share, start_at, warm, kind) for i, share in enumerate(shares) if share],
        )
    rows = [row for part, _ in parts for row in part]
    return rows, sum(cpu for _, cpu in parts), max(r["end"] for r in rows) - start_at
