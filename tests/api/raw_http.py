"""HTTP/1.1 over a plain socket, for tests that must send exactly as little as a slow or hostile client does."""

from __future__ import annotations

import socket

import httpx

from tests.api.servers import API_KEY


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the API on 127.0.0.1:`port` from the address `source` (any of 127.0.0.0/8)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it holds it past `timeout_s`."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"the server still held the connection after {timeout_s} s; it sent {data!r}") from None
    except ConnectionResetError:
        pass
    return data


def read_response(sock: socket.socket, timeout_s: float) -> httpx.Response:
    """One whole response with a Content-Length, read off a connection that may stay open."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < parse(data)[1].get("content-length", 0):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        raise AssertionError(f"no whole response within {timeout_s} s; the server sent {data!r}") from None
    return as_response(data)


def parse(raw: bytes) -> tuple[int, dict, bytes]:
    """(status, headers with lower-case names, body) of a response; a Content-Length as an int."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    if "content-length" in headers:
        headers["content-length"] = int(headers["content-length"])
    return int(lines[0].split(" ")[1]), headers, body


def as_response(raw: bytes) -> httpx.Response:
    status, headers, body = parse(raw)
    return httpx.Response(status, headers={k: str(v) for k, v in headers.items()}, content=body)


def completion_head(port: int, framing: str, extra: str = "") -> bytes:
    """The head of a POST /v1/completions with the test key; `framing` declares its body (Content-Length or
    Transfer-Encoding), `extra` adds header lines (each ending in CRLF)."""
    return (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {API_KEY}\r\n"
            f"content-type: application/json\r\n{extra}{framing}\r\n\r\n").encode()  # fmt: skip
