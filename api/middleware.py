"""Size limits on what a client sends, enforced before a route reads anything.

- headers: the sum of all header names and values over `max_header_bytes` -> 431;
- body: a Content-Length over `max_body_bytes` -> 413 at once; a body without one
  (chunked) is counted while it is read and refused the moment it passes the limit,
  so a huge upload never sits in memory.
Both answer in OpenAI's error envelope.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError, BodyTooLarge, body_too_large, error_response
from api.metrics import ApiMetrics


class SizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes

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
                if declared > self.max_body_bytes:
                    await error_response(body_too_large(self.max_body_bytes))(scope, receive, send)
                    return
        received = 0
        limit = self.max_body_bytes

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)


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
