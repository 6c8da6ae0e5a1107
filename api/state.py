"""The per-app objects every route uses (one Redis client, caches, metrics), built in the lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from redis.asyncio import Redis

from api.admission import Admission
from api.event_hub import EventHub
from api.intake import Intake
from api.keys import ApiKeys
from api.metrics import ApiMetrics
from api.model_info import ModelRegistry
from api.settings import ApiSettings
from api.tokens import TokenizerCache

log = logging.getLogger("inferq.api")

# Requests of one replica on the Redis part of the submit path at once (api/submit.py says why).
SUBMIT_TURNS = 8


@dataclass
class AppState:
    settings: ApiSettings
    redis: Redis
    keys: ApiKeys
    admission: Admission
    models: ModelRegistry
    tokenizers: TokenizerCache
    metrics: ApiMetrics
    hub: EventHub  # the process's one pub/sub connection, shared by every stream it relays
    submit_turns: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SUBMIT_TURNS))
    # Requests on their way to the admission script, counted by the admission gate (api/intake.py).
    intake: Intake = field(default_factory=Intake)
    # Tasks that outlive the request that started them (a cancel after the resume grace period).
    background: set[asyncio.Task] = field(default_factory=set)

    @classmethod
    def build(cls, settings: ApiSettings, metrics: ApiMetrics) -> AppState:
        # NOTE: decode_responses=True: every value read from Redis is a str.
        # NOTE: streams share one pub/sub connection (api/event_hub.py); the pool serves the commands
        # of concurrent requests (submit, XRANGE reads), which under a burst may each hold a connection.
        redis = Redis.from_url(
            settings.redis_url,
            decode_responses=True,
            health_check_interval=30,
            max_connections=settings.redis_max_connections,
        )
        keys = ApiKeys(settings.prefix)
        return cls(
            settings=settings,
            redis=redis,
            keys=keys,
            admission=Admission(redis, keys, settings),
            models=ModelRegistry(redis, keys.wire, settings.served_model_name),
            tokenizers=TokenizerCache(keys.wire.tokenizer),
            metrics=metrics,
            # '~' is outside the request-id alphabet: no request's events go to the anchor channel.
            hub=EventHub(redis, keys.wire.events("~api-hub")),
        )

    async def warm_up(self) -> None:
        """Load the workers' tokenizer now rather than on the first request (best effort)."""
        try:
            await self.tokenizers.get(self.redis)
        except Exception as exc:  # Redis not up yet: the first request will try again
            log.info("tokenizer not loaded at start: %s", exc)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def close(self) -> None:
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)
        await self.hub.close()
        await self.redis.aclose()


def app_state(request: Request) -> AppState:
    return request.app.state.inferq
