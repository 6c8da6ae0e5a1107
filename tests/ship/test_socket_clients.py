"""bench/socket_clients.py's response parsing: the service benchmark checks each stream's status, error events
and usage trailer from what these return (the whole path runs in test_service_overhead_bench.py's dry run)."""

from __future__ import annotations

import asyncio

import pytest

from bench.socket_clients import dechunk, request_bytes, split_response, stream_one


def test_dechunk_joins_the_chunks_and_ignores_extensions() -> None:
    body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n"
    assert dechunk(body) == b"hello, world"


def test_dechunk_refuses_a_body_cut_before_its_last_chunk() -> None:
    with pytest.raises(ValueError):
        dechunk(b"5\r\nhello\r\n")


def test_split_response_reads_status_and_payload_chunked_or_not() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    chunked = head + b"3\r\nabc\r\n0\r\n\r\n"
    assert split_response(chunked) == (200, b"abc")
    plain = b'HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\n\r\n{"error":1}'
    assert split_response(plain) == (400, b'{"error":1}')


def test_split_response_refuses_a_connection_closed_without_a_response() -> None:
    with pytest.raises(RuntimeError, match="no HTTP response"):
        split_response(b"")


def test_request_bytes_frame_the_body() -> None:
    request = request_bytes("http://127.0.0.1:8123", b'{"a": 1}')
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"host: 127.0.0.1:8123" in head and b"content-length: 8" in head and b"connection: close" in head
    assert body == b'{"a": 1}'


def test_stream_one_times_headers_and_first_token_from_a_real_socket() -> None:
    """A server that sends its headers, then a token event split across two writes, then closes."""

    async def run() -> tuple[dict, int, bytes]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            event = b'data: {"choices": [{"text": "hi"}]}\n\n'
            chunk = b"%x\r\n" % len(event) + event + b"\r\n"
            cut = chunk.index(b'"text"') + 3  # the first token's marker straddles the two writes
            writer.write(chunk[:cut])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(chunk[cut:] + b"0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            connection = await asyncio.open_connection("127.0.0.1", port)
            return await stream_one(connection, request_bytes(f"http://127.0.0.1:{port}", b"{}"))

    times, status, payload = asyncio.run(run())
    assert status == 200 and payload == b'data: {"choices": [{"text": "hi"}]}\n\n'
    assert times["start"] < times["headers"] < times["first"] <= times["end"]
    assert times["first"] - times["headers"] >= 0.09  # the first token is the second write's, not the headers'
