"""Streaming completions over plain asyncio sockets: the service benchmark's default load generator.

Why not httpx (bench/service_clients.py keeps it as `--client httpx`): the benchmark's 256 clients share the
GPU machine's CPUs with the API, Redis and the worker, and httpx's own work became part of what was measured.
Its clients used 3.7 cores over the run (~0.2 ms of client CPU a streamed token), and its per-request work in
each 64-client process spread the burst out: the last request left 0.28 s after the first and the first reached
the worker 0.12 s in (H100, 2026-11-27, the run's timeline), while the offline engine it is compared
with has every prompt at once. Measured on the 2-core dev box, 64 requests of 100-1024 ids to one API process
(2026-11-27, f930100): they entered Redis over 0.59-0.75 s from httpx, 0.13-0.22 s from here.

A client's connection is opened and its whole HTTP/1.1 request (headers and body, `connection: close`) encoded
before the clock starts; at the start it is one write. The response is read until the server closes it,
looking only for the headers' end and the first token as bytes arrive; the body is de-chunked and checked
(status, error events, the usage trailer's token count) after the clock has stopped.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

READ_BYTES = 1 << 16


def request_bytes(base: str, body: bytes) -> bytes:
    """A whole POST /v1/completions request to `base` (http://host:port) carrying `body` (JSON)."""
    host = urlsplit(base).netloc
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def open_connection(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(base)
    return await asyncio.open_connection(parts.hostname, parts.port)


def dechunk(body: bytes) -> bytes:
    """The payload of a chunked transfer-encoded body (RFC 9112 7.1; chunk extensions and trailers ignored)."""
    out, pos = bytearray(), 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def split_response(raw: bytes) -> tuple[int, bytes]:
    """(status code, payload) of a whole HTTP/1.1 response as read off the socket."""
    if not raw.startswith(b"HTTP/"):
        raise RuntimeError(f"no HTTP response, the connection gave {raw[:100]!r}")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    chunked = any(line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower() for line in lines[1:])
    return status, dechunk(body) if chunked else body


async def stream_one(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
) -> tuple[dict, int, bytes]:
    """Sends `request` on an open connection and reads the response to its end: (the times of the start, the
    response headers, the first token and the end, as perf_counter seconds; status; payload)."""
    reader, writer = connection
    start = time.perf_counter()
    writer.write(request)
    raw, headers, first = bytearray(), None, None
    while data := await reader.read(READ_BYTES):
        now = time.perf_counter()
        raw += data
        if headers is None and b"\r\n\r\n" in raw:
            headers = now
        # NOTE: the marker may straddle two reads: look at the new bytes and the few before them.
        if first is None and headers is not None and b'"text"' in raw[-len(data) - 6 :]:
            first = now
    end = time.perf_counter()
    writer.close()
    status, payload = split_response(bytes(raw))
    return {"start": start, "headers": headers, "first": first, "end": end}, status, payload
