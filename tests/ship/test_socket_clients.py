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


def _fake_completion_server(events: list[bytes], status: bytes = b"200 OK"):
    """An HTTP/1.1 server that answers any request with these SSE events (chunked), then closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        await reader.readexactly(next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")))
        writer.write(b"HTTP/1.1 " + status + b"\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n"
                     b"connection: close\r\n\r\n")  # fmt: skip
        for event in events:
            writer.write(b"%x\r\n" % len(event) + event + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    return asyncio.start_server(serve, "127.0.0.1", 0)


TOKENS = [b'data: {"choices": [{"text": "t%d"}]}\n\n' % i for i in range(3)]
USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}\n\n'


@pytest.mark.parametrize("kind", ["socket", "httpx"])
def test_both_client_kinds_check_the_usage_trailer(kind: str) -> None:
    """bench/service_clients.py's two load generators read the same stream the same way: the token count from
    the usage trailer must match max_tokens, and an error event fails the stream."""
    from bench import service_clients

    async def one(events: list[bytes], max_tokens: int) -> dict:
        server = await _fake_completion_server(events)
        port = server.sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        async with server:
            if kind == "socket":
                return await service_clients._socket_stream(base, request_bytes(base, b"{}"), max_tokens)
            import httpx

            async with httpx.AsyncClient() as client:
                return await service_clients._stream_one(client, base, [1, 2], max_tokens)

    row = asyncio.run(one([*TOKENS, USAGE, b"data: [DONE]\n\n"], 3))
    assert row["output_tokens"] == 3 and row["start"] < row["headers"] <= row["first"] <= row["end"]
    with pytest.raises(RuntimeError, match="expected 4 tokens"):
        asyncio.run(one([*TOKENS, USAGE], 4))
    with pytest.raises(RuntimeError, match="error"):
        asyncio.run(one([TOKENS[0], b'data: {"error": {"message": "boom"}}\n\n'], 3))
