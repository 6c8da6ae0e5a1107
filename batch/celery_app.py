"""The Celery app of the Batch API: Redis as the broker, every broker key under `{prefix}:batch:celery:`.

Delivery: a task message is acknowledged when its task returns (late acknowledgement) and goes back to the
queue when its worker process is lost; each worker takes one message at a time. A batch's runner also holds
a lease in Redis (batch/lease.py), so a message delivered twice runs the batch once, and a batch whose
worker died is picked up by the sweep of another (batch/sweep.py) without waiting for the broker's
visibility timeout.
"""

from __future__ import annotations

from celery import Celery

from batch.keys import BatchKeys
from batch.settings import BatchSettings

RUN_BATCH = "inferq.batch.run"
QUEUE = "batches"
# NOTE: a message a dead worker held is redelivered by the broker this long after it was taken; the lease and
# the sweep recover a batch much sooner, so this only bounds how long a lost message stays invisible.
VISIBILITY_TIMEOUT_S = 3600


def make_app(settings: BatchSettings) -> Celery:
    app = Celery("inferq_batch", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "global_keyprefix": BatchKeys(settings.prefix).celery,
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
        },
        # No broadcast channels (remote control, events): the broker needs only the task queue's keys.
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
    )
    return app


def send_run(app: Celery, batch_id: str) -> None:
    """Queue a run of the batch (the API on create, the sweep on rescue)."""
    app.send_task(RUN_BATCH, args=[batch_id], queue=QUEUE)
