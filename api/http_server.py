"""The HTTP server in front of the app: uvicorn's config, and what a connection may hold before a request
reaches the app.

Both limits below live in the HTTP protocol (uvicorn's, subclassed) because the ASGI app first hears of a
request once its headers are complete, and never of a connection:

- header timeout: a connection delivers a request's headers within `header_timeout_s` of opening, or of the
  first byte of its next request (an idle kept-alive connection is closed earlier, by uvicorn's keep-alive
  timeout). Past it the connection is closed, after a 408 in OpenAI's envelope when part of a request had
  arrived. uvicorn has no such timeout: a client that never finishes its headers holds its connection forever.
- connection cap: while `max_connections_per_client` connections from one peer address are open, the next one
  is answered 429 in OpenAI's envelope (Retry-After) as soon as its request's headers arrive, and closed; it
  never reaches the app and does not count. nginx's limit_conn answers at the same point. Answering rather
  than closing at once lets the client read why; the header timeout bounds how long such a connection lives.
The body's own deadline is the app's (api/middleware.py): by then the request is a request.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

import uvicorn

from api.errors import RATE_LIMIT, ApiError, error_response
from api.settings import ApiSettings

# Above our own header limit (INFERQ_MAX_HEADER_BYTES), so that our 431 in OpenAI's envelope answers first.
H11_MAX_INCOMPLETE_EVENT_SIZE = 64 * 1024


def _raw_response(err: ApiError) -> bytes:
    """A whole HTTP/1.1 response carrying `err`, closing the connection: written straight to the socket when
    no request cycle exists to answer through."""
    body = json.dumps(err.body()).encode()
    head = (f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


class _GuardedConnection:
    """Mixed in before uvicorn's HttpToolsProtocol or H11Protocol, whose state it reads: `transport`, `client`
    (the peer), `cycle` (the current request; a new one once a request's headers are complete), `app` (what a
    new request is handed to) and `loop`. Class attributes are set per server by `guarded_protocol`."""

    header_timeout_s: float
    header_timeout_response: bytes
    max_connections_per_client: int
    too_many_connections: Any  # the ASGI app that answers a connection over the cap
    open_by_client: dict[str, int]  # this server's open connections by peer address

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True  # no request in progress: the next bytes are a request's head
        self._head_started = False
        self._counted_as: str | None = None
        peer = self.client[0] if self.client else None  # type: ignore[attr-defined]
        if peer is not None and self.max_connections_per_client:
            if self.open_by_client.get(peer, 0) >= self.max_connections_per_client:
                self.app = self.too_many_connections
            else:
                self.open_by_client[peer] = self.open_by_client.get(peer, 0) + 1
                self._counted_as = peer
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._counted_as is not None:
            left = self.open_by_client.pop(self._counted_as) - 1
            if left:
                self.open_by_client[self._counted_as] = left
            self._counted_as = None
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head and data:
            self._head_started = True
            if self._head_timer is None:  # the first byte of the next request on a kept-alive connection
                self._arm_head_timer()
        cycle = self.cycle  # type: ignore[has-type]
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not cycle:  # a request's head is complete: it is the app's now
            self._awaiting_head = False
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        # NOTE: no timer here: until the next request's first byte the connection is idle, which uvicorn's
        # keep-alive timeout bounds. A pipelined request already parsed is in progress, not awaited.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):  # type: ignore
            self._awaiting_head = True
            self._head_started = False

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)  # type: ignore

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        transport = self.transport  # type: ignore[has-type]
        if not self._awaiting_head or transport.is_closing():
            return
        if self._head_started:
            transport.write(self.header_timeout_response)
        transport.close()


def guarded_protocol(settings: ApiSettings) -> type[asyncio.Protocol]:
    """uvicorn's protocol of `settings.http_parser` with the header timeout and the connection cap; each call
    makes a class of its own, so that each server counts its own connections."""
    if settings.http_parser == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    timeout = ApiError(
        408,
        f"the request's headers did not arrive within {settings.header_timeout_s:g} s (INFERQ_HEADER_TIMEOUT_S)",
        code="request_timeout",
    )
    too_many = ApiError(
        429,
        f"this client has {settings.max_connections_per_client} connections open to this server, the limit "
        "(INFERQ_MAX_CONNECTIONS_PER_CLIENT); reuse or close one",
        type=RATE_LIMIT,
        code="too_many_connections",
        headers={"Retry-After": "1", "Connection": "close"},
    )
    attributes = {
        "header_timeout_s": settings.header_timeout_s,
        "header_timeout_response": _raw_response(timeout),
        "max_connections_per_client": settings.max_connections_per_client,
        "too_many_connections": error_response(too_many),
        "open_by_client": {},
    }
    return type(f"Guarded{base.__name__}", (_GuardedConnection, base), attributes)


def server_config(app: Any, settings: ApiSettings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn config that serves `app` under `settings` (`python -m api`, and the tests' servers)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": settings.event_loop,
        "http": guarded_protocol(settings),
        # The API has no WebSocket route: an Upgrade header is ignored and the request served as plain HTTP.
        "ws": "none",
        "h11_max_incomplete_event_size": H11_MAX_INCOMPLETE_EVENT_SIZE,
        "proxy_headers": True,
        "log_level": "info",
        "timeout_graceful_shutdown": 10,
    }
    return uvicorn.Config(app, **{**options, **overrides})
