"""A full queue's 503, answered before a completion is parsed, validated or tokenized.

Past the cap the admission script (api/admission.py) refuses every new request, but only after
the request was read, parsed, validated and tokenized: under a burst the refusals wait behind
that work, and each one costs as much CPU as an admitted request. The gate answers them first,
in two steps around the body's read (api/middleware.py):
- on the headers: the queue's live depth across replicas (one ZCOUNT); a full queue is refused
  at once, so its body is never read;
- on the body: that depth plus this replica's requests already on their way to the script
  (api/intake.py, no Redis); a burst that reached an empty queue together is cut at the cap
  here, since all of its headers arrive before the first of its requests is admitted.
  Counting a request from its body on, not its headers, keeps a client that sends its body
  slowly from holding places it may never use.

The gate is a hint, not the admission: the script stays the one exact, atomic check. A request
the gate lets through may still be refused there; one it refuses would have been refused there
too, unless a request ahead of it fails validation or a place frees meanwhile (the client retries
after Retry-After). Passed through untouched: every other route; a request with an Idempotency-Key
(a retry attaches to its earlier request, full queue or not); a request without a valid API key
(the route answers its 401); any request when Redis fails (the route answers that).
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import caller_from_header
from api.errors import error_response
from api.intake import holding_ticket

log = logging.getLogger("inferq.api")

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# Where the headers step leaves the depth it read for the body step; absent: the request is not gated.
QUEUED_AT_HEADERS = "inferq.queued_at_headers"


class HeadersGateMiddleware:
    """Outside the body's read: a full queue is refused before its body is read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in COMPLETION_PATHS:
            queued = await self._queued(scope)
            if queued is not None:
                admission = scope["app"].state.inferq.admission
                if queued >= admission.settings.max_queued_requests:
                    await error_response(admission.overloaded(queued))(scope, receive, send)
                    return
                scope[QUEUED_AT_HEADERS] = queued
        await self.app(scope, receive, send)

    async def _queued(self, scope: Scope) -> int | None:
        """The queue's live depth, or None when the request passes ungated."""
        authorization = None
        for name, value in scope.get("headers") or []:
            if name == b"idempotency-key":
                return None
            if name == b"authorization":
                authorization = value.decode("latin-1")
        app = scope["app"]
        if caller_from_header(authorization, app.state.settings) is None:
            return None
        try:
            return await app.state.inferq.admission.live_queued()
        except RedisError as exc:
            log.debug("admission gate: queue depth unknown (%s); the route decides", exc)
            return None


class BodyGateMiddleware:
    """Inside the body's read: the depth read on the headers plus this replica's intake; a request that fits
    holds an intake ticket until the admission script answers it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        queued = scope.get(QUEUED_AT_HEADERS)
        if queued is None:
            await self.app(scope, receive, send)
            return
        state = scope["app"].state.inferq
        ahead = queued + state.intake.count
        if ahead >= state.admission.settings.max_queued_requests:
            await error_response(state.admission.overloaded(ahead))(scope, receive, send)
            return
        with holding_ticket(state.intake):
            await self.app(scope, receive, send)
