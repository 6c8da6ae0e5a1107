"""The worker loop's intake: reading messages into the batch window and admitting them.

A mixin of worker.loop.Worker, split out by idea; it uses the Worker's settings, engine, jobs,
window, held, intake, admitter, publisher, metrics, cancels, step_reads, redis_backoff and _redis_call.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class StepReadsSent:
    """What `_send_step_reads` sent, in order: the cancel check's commands for these request ids,
    then (read_new) one XREADGROUP of new messages."""

    cancel_ids: list[str]
    num_cancel_commands: int
    read_new: bool


class IntakeLoop:
    def _send_reads_for_step(self) -> None:
        """Send the step's reads (new messages, the cancel check) without waiting, before the engine
        schedules it; `_finish_step_reads` reads their replies after the step's outputs."""
        try:
            if self._redis_usable():
                self._redis_call(self._send_step_reads)
        except Exception:  # a bug here must not fail the step's requests
            logger.exception("sending a step's reads to Redis failed")

    def _send_step_reads(self) -> bool:
        """Own pending messages and claims (rare) are read at once; the cancel check and the read of
        new messages are only sent (worker/deferred_replies.py). Returns whether it reached Redis."""
        reached = False
        if not self.is_draining:
            reached = self._read(deferred_new=True)
        cancel_ids = list(self.jobs)
        commands = self.cancels.commands(cancel_ids)
        num_cancel_commands = len(commands)
        free_slots = self._num_free_slots()
        read_new = not self.is_draining and free_slots > 0 and self._has_kv_room()
        if read_new:
            commands.append(self.intake.read_new_command(free_slots))
        if not commands:
            return reached
        self.step_reads.send(commands)
        self._step_reads_sent = StepReadsSent(cancel_ids, num_cancel_commands, read_new)
        return True

    def _num_free_slots(self) -> int:
        return self.settings.max_num_seqs - len(self.jobs) - len(self.window)

    def _has_kv_room(self) -> bool:
        """Read only while the KV pool has room beyond the prompts already waiting for it, so
        messages this worker could not start soon stay in the stream for other workers."""
        if not self.jobs:
            return True
        reserved = sum(job.num_prompt_tokens for job in self.jobs.values() if not job.started)
        return self._last_stats.num_free_kv_tokens - reserved >= self.settings.block_size

    def _block_ms(self) -> int | None:
        """How long a read may wait: never while the engine has work; up to the window's end while
        gathering; otherwise idle_block_ms, or until the next claim pass."""
        if self.engine.has_unfinished_requests():
            return None
        if len(self.window):
            return self.window.ms_left() or None
        until_claim_ms = int((self._next_claim_at - time.monotonic()) * 1000)
        return max(1, min(self.settings.idle_block_ms, until_claim_ms))

    def _intake(self) -> None:
        if self._redis_usable():
            self._redis_call(self._read_and_admit)
        elif not self.engine.has_unfinished_requests():
            time.sleep(min(0.05, max(0.0, self.redis_backoff.retry_at - time.monotonic())))

    def _read_and_admit(self) -> bool:
        """Own pending first, then abandoned messages, then new ones. Returns whether it reached Redis."""
        reached = self._read()
        return self._admit_window_if_due() or reached

    def _read(self, deferred_new: bool = False) -> bool:
        """Redis reads into the window only (safe while the engine is mid-step); deferred_new leaves
        the read of new messages to the caller."""
        reached = False
        if self._need_own_pending:
            self._receive(self.intake.read_own_pending(max(1, self._num_free_slots())))
            self._need_own_pending, reached = False, True
        now = time.monotonic()
        if now >= self._next_claim_at and self._num_free_slots() > 0:
            self._next_claim_at = now + self.settings.claim_interval_ms / 1000
            self._receive(self.intake.claim_abandoned(self._num_free_slots()))
            reached = True
        if not deferred_new and self._num_free_slots() > 0 and self._has_kv_room():
            self._receive(self.intake.read_new(self._num_free_slots(), self._block_ms()))
            reached = True
        return reached

    def _admit_if_due(self) -> None:
        """While busy: admit what the reads during the last step gathered, once the window is due."""
        if self._redis_usable():
            self._redis_call(self._admit_window_if_due)

    def _admit_window_if_due(self) -> bool:
        """Returns whether it admitted (and so reached Redis).
        NOTE: admit() does all its Redis reads before touching the engine, so a failure here leaves
        the window as it was, to be admitted on a later try."""
        if not len(self.window) or not self.window.is_due(self._num_free_slots()):
            return False
        self._admit(self.window.deliveries)
        self.window.take()
        return True

    def _receive(self, deliveries) -> None:
        fresh = self.held.add_new([d.message_id for d in deliveries])
        self.window.add([d for d in deliveries if d.message_id in fresh])

    def _admit(self, deliveries) -> None:
        admission = self.admitter.admit(deliveries, set(self.jobs))
        admitted = {job.message_id for job in admission.jobs}
        self.held.release([d.message_id for d in deliveries if d.message_id not in admitted])
        self.jobs.update((job.request_id, job) for job in admission.jobs)
        if admission.jobs:  # cancelled before they came in: the counter moved before the last check
            self.cancels.read_all_next()
        self.metrics.admitted.inc(len(admission.jobs))
        self.metrics.dead_letters.inc(admission.num_dead_letters)
        self.publisher.submit(admission.batch)
        self._snapshot = self._make_snapshot()
