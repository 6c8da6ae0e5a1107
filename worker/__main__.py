"""`python -m worker --model ... --redis-url ...`: one worker process per GPU.

SIGTERM or SIGINT: stop reading, finish running requests within shutdown_grace_s, hand the rest
back to the group, exit 0. A second signal hands everything off at once.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys

from worker.loop import Worker
from worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> int:
    settings = WorkerSettings.from_cli(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # torch loads only now, after the flags parsed (`--help` and a bad flag answer at once).
    from engine.engine_setup import resolve_device
    from worker.cpu_threads import apply_cpu_threads

    apply_cpu_threads(settings.cpu_threads, resolve_device(settings.device))
    worker = Worker(settings)
    # NOTE: the engine's start leaves a few 100k long-lived Python objects (model, tokenizer,
    # imports) that every full garbage collection would walk again, landing in some step. Freezing
    # them keeps those collections short (decision 0007). Done here, once per process, not in the engine:
    # frozen objects are never collected, so a process that builds several engines would leak them.
    gc.collect()
    gc.freeze()
    signals_seen = 0

    def on_signal(signum, frame) -> None:
        nonlocal signals_seen
        signals_seen += 1
        logging.getLogger("worker").info("signal %d: stopping (%s)", signum, "now" if signals_seen > 1 else "graceful")
        worker.request_stop(force=signals_seen > 1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
