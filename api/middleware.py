"""Limits on what a client sends and how slowly, enforced before a route reads anything.

- headers: the sum of all header names and values over `max_header_bytes` -> 431;
- body size: a Content-Length over `max_body_bytes` -> 413 at once; a body without one
  (chunked) is counted while it is read and refused the moment it passes the limit,
  so a huge upload never sits in memory;
- body time: the whole body must arrive within `body_timeout_s` of the request's headers
  -> 408, and the connection is closed (a client that declares a body and sends less of it
  would otherwise hold its connection, and the request, forever).
The body is read here, whole, before the route runs, and handed on as one message. All
answer in OpenAI's error envelope; those that leave a body half read close the connection.
The headers' own deadline is the server's (api/http_server.py).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError, body_too_large, error_response
from api.metrics import ApiMetrics

# The rest of a refused body is never read: the connection cannot carry another request.
CLOSE = {"Connection": "close"}


def _declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


# Uploads of batch input files (api/routes_files.py) have their own limits: a file's size, and the time
# such a body may take.
UPLOAD_PATH = "/v1/files"
# Room for the multipart framing and the form's other fields around the file itself.
UPLOAD_FRAMING_BYTES = 64 * 1024


def is_upload(scope: Scope) -> bool:
    return scope.get("method") == "POST" and scope.get("path") == UPLOAD_PATH


class SizeLimitMiddleware:
    """Header bytes (431) and a declared Content-Length (413), before anything else runs."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_header_bytes: int, max_upload_bytes: int = 0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.max_upload_bytes = max(max_upload_bytes + UPLOAD_FRAMING_BYTES, max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        header_bytes = sum(len(name) + len(value) for name, value in headers)
        if header_bytes > self.max_header_bytes:
            err = ApiError(
                431,
                f"request headers are {header_bytes} bytes, over the limit of {self.max_header_bytes}",
                code="headers_too_large",
            )
            await error_response(err)(scope, receive, send)
            return
        for name, value in headers:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await error_response(ApiError(400, "invalid Content-Length header"))(scope, receive, send)
                    return
                limit = self.max_upload_bytes if is_upload(scope) else self.max_body_bytes
                if declared > limit:
                    await error_response(body_too_large(limit))(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class BodyReadMiddleware:
    """Reads a request's body whole, within `body_timeout_s` and `max_body_bytes`, then runs the app with it.

    NOTE: inside the admission gate's headers step, so that a full queue's refusal never waits for a body
    (api/admission_gate.py)."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float,
        max_upload_bytes: int = 0,
        upload_timeout_s: float = 0.0,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_upload_bytes = max(max_upload_bytes + UPLOAD_FRAMING_BYTES, max_body_bytes)
        self.upload_timeout_s = max(upload_timeout_s, body_timeout_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _declares_body(scope.get("headers") or []):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        received = 0
        upload = is_upload(scope)
        max_bytes = self.max_upload_bytes if upload else self.max_body_bytes
        timeout_s = self.upload_timeout_s if upload else self.body_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client left before its body was in: nobody to answer
                    chunk = message.get("body", b"")
                    received += len(chunk)
                    if received > max_bytes:
                        err = body_too_large(max_bytes)
                        err.headers.update(CLOSE)
                        await error_response(err)(scope, receive, send)
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            err = ApiError(
                408,
                f"the request body did not arrive within {timeout_s:g} s of its headers "
                f"({received} bytes came; {'INFERQ_UPLOAD_TIMEOUT_S' if upload else 'INFERQ_BODY_TIMEOUT_S'})",
                code="request_timeout",
                headers=dict(CLOSE),
            )
            await error_response(err)(scope, receive, send)
            return
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect

        await self.app(scope, replay, send)


class ErrorCountMiddleware:
    """Counts answers with status >= 400 by status (inferq_api_rejected_requests_total)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                self.metrics.rejected.labels(reason=str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
