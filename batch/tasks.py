"""The Celery tasks of a batch worker, registered on its app."""

from __future__ import annotations

import logging

from celery import Celery

from api.settings import ApiSettings
from batch.celery_app import RUN_BATCH
from batch.redis_client import records_client
from batch.runner import BatchRunner
from batch.settings import BatchSettings

log = logging.getLogger("inferq.batch")


def register(app: Celery, settings: BatchSettings, api_settings: ApiSettings) -> None:
    def run_batch(batch_id: str) -> str:
        redis = records_client(settings.redis_url)
        try:
            outcome = BatchRunner(redis, settings, api_settings, batch_id).run()
        finally:
            redis.close()
        log.info("batch %s: %s", batch_id, outcome)
        return outcome

    app.task(name=RUN_BATCH)(run_batch)
