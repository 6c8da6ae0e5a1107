"""The open-loop clients of bench/online_latency.py: each request is sent at its scheduled arrival time,
whatever the service is doing (a Poisson process, not a fixed number of users waiting on replies), as a
streaming POST /v1/completions whose token chunks are timed. Requests go out from CLIENT_PROCS processes
(request i from process i % CLIENT_PROCS, to API replica process % replicas) so that the clients are not
the bottleneck.

A request's record: when it was due and sent, its response headers, the arrival of every token chunk (an
SSE event of the request's result events with no finish reason: one a token here), its end, the completion
tokens its usage trailer reports, and an error (HTTP status, an error event, a stream without the tokens
asked for, an exception) or None.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time

from bench.service_clients import CLIENT_PROCS, request_body

Job = tuple[float, list[int], int]  # (due, seconds after the start; prompt token ids; max_tokens)


def read_sse_line(line: str, row: dict, now: float) -> bool:
    """Files one line of the stream into `row` (chunk times, usage, error); True at `[DONE]`."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if data == "[DONE]":
        return True
    event = json.loads(data)
    if "error" in event:
        row["error"] = f"error event: {event['error'].get('message', event['error'])}"
    choices = event.get("choices") or []
    if choices and choices[0].get("finish_reason") is None:
        row["chunks"].append(now)
    if event.get("usage"):
        row["completion_tokens"] = event["usage"]["completion_tokens"]
    return False


async def _one(client, base: str, start_at: float, due: float, body: bytes, max_tokens: int) -> dict:
    await asyncio.sleep(max(0.0, start_at + due - time.perf_counter()))
    row = {"due": start_at + due, "sent": time.perf_counter(), "headers": None, "chunks": [], "end": None,
           "max_tokens": max_tokens, "completion_tokens": None, "error": None}  # fmt: skip
    try:
        async with client.stream(
            "POST", f"{base}/v1/completions", content=body, headers={"content-type": "application/json"}
        ) as response:
            row["headers"] = time.perf_counter()
            if response.status_code != 200:
                row["error"] = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            else:
                async for line in response.aiter_lines():
                    if read_sse_line(line, row, time.perf_counter()):
                        break
    except Exception as exc:  # a failed request is a row with its error, not a failed run
        row["error"] = f"{type(exc).__name__}: {exc}"
    row["end"] = time.perf_counter()
    if row["error"] is None and row["completion_tokens"] != max_tokens:
        row["error"] = f"expected {max_tokens} tokens, usage says {row['completion_tokens']}"
    return row


async def _clients(base: str, jobs: list[Job], start_at: float) -> list[dict]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0)) as client:
        bodies = [request_body(prompt, max_tokens) for _, prompt, max_tokens in jobs]  # encoded off the clock
        return await asyncio.gather(
            *(_one(client, base, start_at, due, body, n) for (due, _, n), body in zip(jobs, bodies, strict=True))
        )


def _client_proc(base: str, jobs: list[Job], start_at: float) -> list[dict]:
    return asyncio.run(_clients(base, jobs, start_at))


def run_open_loop(bases: list[str], jobs: list[Job], lead_s: float = 2.0) -> tuple[list[dict], float]:
    """Sends every job at its due time (seconds after a start lead_s from now); returns (the rows, in due
    order; the start, on time.perf_counter's clock, CLOCK_MONOTONIC, the same in every process)."""
    shares = [jobs[i::CLIENT_PROCS] for i in range(CLIENT_PROCS)]
    start_at = time.perf_counter() + lead_s
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(CLIENT_PROCS) as pool:
        parts = pool.starmap(
            _client_proc, [(bases[i % len(bases)], share, start_at) for i, share in enumerate(shares) if share]
        )
    rows = sorted((row for part in parts for row in part), key=lambda row: row["due"])
    return rows, start_at
