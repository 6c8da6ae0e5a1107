"""Operations routes: GET /health (process up) and GET /ready (Redis and a live worker), open to probes
without a key; GET /metrics (an API key, as on every other route: Prometheus scrapes with one).

/ready never answers 401: a load balancer's or orchestrator's readiness probe holds no key. Without
one it does not show the Redis error's text (it may name internal hosts); with one, or with auth
off, it does.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from api.auth import AuthorizedCaller, OptionalCaller
from api.responses import error_responses
from api.state import app_state

router = APIRouter()


@router.get("/health", responses={200: {"description": "The process is up"}})
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/ready",
    responses={
        200: {"description": "Redis answers and a worker is alive"},
        503: {"description": "Not ready: Redis unreachable or no live worker"},
    },
)
async def ready(request: Request, caller: OptionalCaller) -> JSONResponse:
    state = app_state(request)
    try:
        await state.redis.ping()
        workers = await state.models.live_workers()
    except RedisError as exc:
        redis = f"unreachable: {exc}" if caller is not None else "unreachable"
        return JSONResponse({"status": "not ready", "redis": redis, "workers": 0}, status_code=503)
    if not workers:
        return JSONResponse({"status": "not ready", "redis": "ok", "workers": 0}, status_code=503)
    return JSONResponse({"status": "ready", "redis": "ok", "workers": len(workers)})


@router.get(
    "/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}} | error_responses(401)
)
async def metrics(request: Request, _: AuthorizedCaller) -> Response:
    state = app_state(request)
    m = state.metrics
    try:
        # The cluster-wide gauges are read at scrape time, from Redis.
        workers = await state.models.live_workers()
        queued, queued_tokens = await state.admission.queued()
        info = await state.models.info()
        model = state.models.names(info)[0] if info else ""
        m.live_workers.set(len(workers))
        m.running.labels(model).set(sum(w.running for w in workers))
        m.waiting.labels(model).set(sum(w.waiting for w in workers))
        m.queued_requests.set(queued)
        m.queued_tokens.set(queued_tokens)
    except RedisError:
        pass  # the counters and histograms still answer
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
