"""`python -m batch`: one Celery worker of the Batch API (solo pool: one batch at a time per process; run
more processes or replicas for more batches at once) and its sweep thread.

Every setting comes from the environment (INFERQ_*, docs/settings.md); arguments are passed to Celery's
worker (for example `--hostname batch1@%h`, `--loglevel INFO`).
"""

from __future__ import annotations

import logging
import sys

from api.settings import ApiSettings
from batch.celery_app import QUEUE, make_app, send_run
from batch.settings import BatchSettings
from batch.sweep import Sweeper
from batch.tasks import register


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = BatchSettings()
    app = make_app(settings)
    register(app, settings, ApiSettings())
    sweeper = Sweeper(settings, lambda batch_id: send_run(app, batch_id))
    sweeper.start()
    args = ["worker", "--pool", "solo", "--queues", QUEUE, "--without-gossip", "--without-mingle"]
    args += ["--without-heartbeat", "--loglevel", "INFO", *(sys.argv[1:] if argv is None else argv)]
    try:
        app.worker_main(args)
    finally:
        sweeper.stop()


if __name__ == "__main__":
    main()
