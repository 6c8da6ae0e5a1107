"""Clients that hold connections without finishing a request: a header timeout, a body timeout, and a cap on one
client address's open connections (api/http_server.py, api/middleware.py). Raw sockets, so that a test can send
exactly as little as a slow or hostile client does."""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest

from tests.api.raw_http import as_response, completion_head, connect, read_response, read_until_closed
from tests.api.wire import MODEL, assert_envelope

BODY = json.dumps({"model": MODEL, "prompt": "Hi"}).encode()


@pytest.fixture(params=["httptools", "h11"])
def http_parser(request) -> str:
    """The guard subclasses the protocol of either parser: each test of it runs on both."""
    return request.param


@pytest.mark.parametrize(
    ("framing", "part"),
    [("content-length: 100000", b'{"model":'), ("transfer-encoding: chunked", b'9\r\n{"model":\r\n')],
    ids=["content-length", "chunked"],
)
def test_a_body_that_stops_coming_is_answered_408_and_closed(start_api, framing, part):
    api = start_api(body_timeout_s=1.0)
    with connect(api.port) as slow:
        started = time.monotonic()
        slow.sendall(completion_head(api.port, framing) + part)
        # Another client is served meanwhile.
        with api.client(api_key=None) as other:
            assert other.get("/health").status_code == 200
        response = as_response(read_until_closed(slow, timeout_s=10))
        elapsed = time.monotonic() - started
    error = assert_envelope(response, 408)
    assert error["code"] == "request_timeout" and "INFERQ_BODY_TIMEOUT_S" in error["message"]
    assert response.headers["connection"] == "close"
    assert 0.9 < elapsed < 4.0


def test_a_whole_body_within_the_timeout_is_served(start_api):
    api = start_api(body_timeout_s=1.0, api_keys=[])
    with connect(api.port) as client:
        head = completion_head(api.port, f"content-length: {len(BODY)}")
        client.sendall(head + BODY[:5])
        time.sleep(0.5)
        client.sendall(BODY[5:])
        response = read_response(client, timeout_s=10)
    assert response.json()["error"]["code"] == "no_model"  # the route ran, with the whole body


def send_trickling(sock: socket.socket, first: bytes, timeout_s: float) -> tuple[bytes, float]:
    """Sends `first`, then a header line every 0.2 s (never the head's end) until the server answers and closes:
    (what it sent, seconds from `first` to the close)."""
    started = time.monotonic()
    sock.sendall(first)
    n = 0
    while time.monotonic() - started < timeout_s:
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            return read_until_closed(sock, timeout_s), time.monotonic() - started
        n += 1
        try:
            sock.sendall(f"x-slow-{n}: {n}\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            return b"", time.monotonic() - started
    raise AssertionError(f"the server still held a trickling connection after {timeout_s} s")


def test_headers_that_trickle_past_the_timeout_are_cut(start_api, http_parser):
    api = start_api(header_timeout_s=1.0, http_parser=http_parser)
    with connect(api.port) as slow:
        raw, elapsed = send_trickling(slow, b"GET /health HTTP/1.1\r\nhost: x\r\n", timeout_s=10)
    response = as_response(raw)
    error = assert_envelope(response, 408)
    assert error["code"] == "request_timeout" and "INFERQ_HEADER_TIMEOUT_S" in error["message"]
    assert 0.9 < elapsed < 4.0


def test_a_connection_that_sends_nothing_is_closed(start_api, http_parser):
    api = start_api(header_timeout_s=1.0, http_parser=http_parser)
    with connect(api.port) as idle:
        started = time.monotonic()
        assert read_until_closed(idle, timeout_s=10) == b""
        assert 0.9 < time.monotonic() - started < 4.0


def test_the_next_request_on_a_kept_alive_connection_has_the_same_deadline(start_api, http_parser):
    api = start_api(header_timeout_s=1.0, http_parser=http_parser)
    with connect(api.port) as client:
        client.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_response(client, timeout_s=5).status_code == 200
        raw, elapsed = send_trickling(client, b"GET /health HTTP/1.1\r\n", timeout_s=10)
    assert_envelope(as_response(raw), 408)
    assert 0.9 < elapsed < 4.0


def test_one_address_over_its_connection_cap_is_refused_while_another_is_served(start_api, http_parser):
    api = start_api(max_connections_per_client=3, header_timeout_s=30, http_parser=http_parser)
    held = [connect(api.port) for _ in range(3)]
    try:
        with httpx.Client(base_url=api.url, timeout=5) as fourth:
            started = time.monotonic()
            refused = fourth.get("/health")
            assert time.monotonic() - started < 2.0
        error = assert_envelope(refused, 429)
        assert error["code"] == "too_many_connections" and "INFERQ_MAX_CONNECTIONS_PER_CLIENT" in error["message"]
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        # Another address (127.0.0.2 reaches the same loopback listener) is served.
        other = httpx.Client(base_url=api.url, timeout=5, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with other:
            assert other.get("/health").status_code == 200
        # One of the three closes: the address may open another.
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:
            with httpx.Client(base_url=api.url, timeout=5) as again:
                status = again.get("/health").status_code
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200
    finally:
        for sock in held:
            sock.close()
