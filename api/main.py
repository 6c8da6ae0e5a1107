"""The FastAPI app: `create_app(settings)` for tests and embedding, `app` for `uvicorn api.main:app`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from api import routes_batches, routes_docs, routes_files, routes_health, routes_openai, routes_requests, routes_ui
from api.admission_gate import BodyGateMiddleware, HeadersGateMiddleware
from api.errors import install_error_handlers
from api.metrics import ApiMetrics
from api.middleware import BodyReadMiddleware, ErrorCountMiddleware, SizeLimitMiddleware
from api.settings import ApiSettings
from api.state import AppState
from batch.settings import BatchSettings


def create_app(settings: ApiSettings | None = None, batch_settings: BatchSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    # The Batch API's settings (files directory, upload limit) from the environment; Redis as the API's.
    batch_settings = batch_settings or BatchSettings(redis_url=settings.redis_url, prefix=settings.prefix)
    metrics = ApiMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = AppState.build(settings, metrics)
        app.state.inferq = state
        state.spawn(state.warm_up())
        try:
            yield
        finally:
            await state.close()
            services = getattr(app.state, "batch_services", None)
            if services is not None:
                services.close()

    app = FastAPI(
        title="inferq",
        summary="OpenAI-compatible LLM inference over Redis Streams",
        version="0.1.0",
        lifespan=lifespan,
        # Served by api/routes_docs.py instead, behind the API key when auth is on.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.batch_settings = batch_settings
    app.state.metrics = metrics
    app.state.started = time.time()
    install_error_handlers(app)

    app.include_router(routes_openai.router)
    app.include_router(routes_requests.router)
    app.include_router(routes_files.router)
    app.include_router(routes_batches.router)
    app.include_router(routes_health.router)
    app.include_router(routes_ui.router)
    app.include_router(routes_docs.router)
    # Middlewares, innermost first. The admission gate's two steps sit around the body's read (a full queue needs
    # none of the body; the body step sees this replica's intake); all three inside CORS, so that a browser
    # can read a 408 or a 503 too.
    app.add_middleware(BodyGateMiddleware)
    app.add_middleware(
        BodyReadMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_upload_bytes=batch_settings.max_file_bytes,
        upload_timeout_s=settings.upload_timeout_s,
    )
    app.add_middleware(HeadersGateMiddleware)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
            expose_headers=["X-Request-Id", "Retry-After"],
        )
    app.add_middleware(ErrorCountMiddleware, metrics=metrics)
    # Outermost: refuse oversized requests before anything else runs.
    app.add_middleware(
        SizeLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
        max_upload_bytes=batch_settings.max_file_bytes,
    )
    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn api.main:app` builds the app from the environment on first access only, so that
    # importing this module (tests, create_app) never reads the environment.
    if name == "app":
        app = create_app()
        globals()["app"] = app
        return app
    raise AttributeError(name)
