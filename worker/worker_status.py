"""What a worker reports about itself: the heartbeat's snapshot (the engine's room and load), the engine's
counters in /metrics, and the log of its recent steps. The loop rebuilds them after each step and after aborts
outside a step; the heartbeat thread only reads `snapshot`, never the engine."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from worker.metrics import WorkerMetrics
from worker.protocol import WorkerHeartbeat
from worker.step_log import STEP_LOG_SIZE, StepLog


class WorkerStatus:
    """Args:
    engine: the worker's LLMEngine.
    metrics: its Prometheus metrics.
    consumer, model_name: how the heartbeat names the worker and its model.
    num_windowed: messages read but not yet admitted (the batch window): waiting, for the heartbeat.
    slots: the worker's sequence slots (max_num_seqs), for the heartbeat.
    """

    def __init__(
        self,
        engine,  # noqa: ANN001
        metrics: WorkerMetrics,
        consumer: str,
        model_name: str,
        num_windowed: Callable[[], int],
        slots: int,
    ) -> None:
        self.engine, self.metrics = engine, metrics
        self.consumer, self.model_name, self.num_windowed = consumer, model_name, num_windowed
        self.slots = slots
        self.started = time.time()
        self.step_log: deque[StepLog] = deque(maxlen=STEP_LOG_SIZE)
        self.stats = engine.stats()
        self.snapshot = self._make_snapshot()

    def after_step(self, running_request_ids: list[str]) -> None:
        """The engine's counters after its last step, into /metrics, the step log and the snapshot."""
        record = self.engine.last_step
        stats, previous = self.engine.stats(), self.stats
        self.stats = stats
        self.metrics.observe_stats(stats, previous)
        self.step_log.append(
            StepLog(
                step=record.step,
                time=time.monotonic(),
                scheduled=dict(record.scheduled),
                new_request_ids=list(record.new_request_ids),
                num_free_kv_tokens=stats.num_free_kv_tokens,
                running_request_ids=running_request_ids,
            )
        )
        self.snapshot = self._make_snapshot()

    def refresh(self) -> None:
        """After aborts outside a step: the heartbeat must show the freed KV blocks now, not after the next step
        (an idle worker may not step again for a long time)."""
        self.stats = self.engine.stats()
        self.snapshot = self._make_snapshot()

    def refresh_snapshot(self) -> None:
        """The snapshot alone (the batch window changed: the engine did not)."""
        self.snapshot = self._make_snapshot()

    def _make_snapshot(self) -> WorkerHeartbeat:
        stats = self.stats
        self.metrics.observe_stats(stats)
        return WorkerHeartbeat(
            consumer=self.consumer,
            model=self.model_name,
            max_model_len=self.engine.max_model_len,
            started=self.started,
            ts=time.time(),
            running=stats.num_running,
            waiting=stats.num_waiting + self.num_windowed(),
            free_kv_tokens=stats.num_free_kv_tokens,
            slots=self.slots,
        )
