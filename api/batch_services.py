"""The Batch API's stores as the API uses them: a synchronous Redis client (the stores are shared with the
Celery workers, which are synchronous), called from worker threads so the event loop never waits on them,
and the Celery app that queues a batch's run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
from celery import Celery
from fastapi import Request
from redis import Redis

from batch.batch_store import BatchStore
from batch.celery_app import make_app, send_run
from batch.file_store import FileStore
from batch.keys import BatchKeys
from batch.redis_client import records_client
from batch.settings import BatchSettings

T = TypeVar("T")


@dataclass
class BatchServices:
    settings: BatchSettings
    redis: Redis
    files: FileStore
    batches: BatchStore
    celery: Celery

    @classmethod
    def build(cls, settings: BatchSettings) -> BatchServices:
        redis = records_client(settings.redis_url)
        keys = BatchKeys(settings.prefix)
        return cls(
            settings=settings,
            redis=redis,
            files=FileStore(redis, keys, settings.files_dir, settings.files_ttl_s),
            batches=BatchStore(redis, keys),
            celery=make_app(settings),
        )

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        return await anyio.to_thread.run_sync(fn, *args)

    async def dispatch(self, batch_id: str) -> None:
        await anyio.to_thread.run_sync(send_run, self.celery, batch_id)

    def close(self) -> None:
        self.redis.close()
        self.celery.close()


def batch_services(request: Request) -> BatchServices:
    """The app's services, built on first use (an API that serves no batch opens no connection for them)."""
    app_state = request.app.state
    services = getattr(app_state, "batch_services", None)
    if services is None:
        services = BatchServices.build(app_state.batch_settings)
        app_state.batch_services = services
    return services
