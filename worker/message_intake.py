"""The worker's intake: messages from the request stream into the batch window, and the window into the engine.

When to read and how many is decided here, by free sequence slots (plus, under the priority policy, a queue
that waits in the engine: decision 0062) and KV room; the Redis commands are worker/stream_reader.py's. While
the engine is busy the reads ride the steps (decision 0025): `send_step_reads` sends the read of new messages,
with the cancel check the loop adds, before the engine schedules a step, and `receive_step_reads` reads the
replies after the step's outputs. The Worker (worker/loop.py) owns one
MessageIntake and calls it from its loop thread only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from worker.admit import Admitter
from worker.cancel import CancelWatch
from worker.deferred_replies import DeferredReplies
from worker.event_publisher import Publisher
from worker.event_publisher_process import PublisherProcess
from worker.held import HeldMessages
from worker.job import Job
from worker.metrics import WorkerMetrics
from worker.settings import WorkerSettings
from worker.stream_reader import Delivery, StreamReader
from worker.window import BatchWindow


@dataclass
class StepReadsSent:
    """What `send_step_reads` sent, in order: the cancel check's commands for these request ids,
    then (read_new) one XREADGROUP of new messages."""

    cancel_ids: list[str]
    num_cancel_commands: int
    read_new: bool


class MessageIntake:
    """Reads messages into the batch window and admits the window once it is due.

    Args:
        settings: the worker's settings (max_num_seqs, max_queued_seqs, scheduling_policy, block_size,
            claim_interval_ms, idle_block_ms, the window's).
        engine: the LLMEngine (whether it has work decides how long an idle read may wait).
        jobs: the worker's jobs in the engine, request id -> Job: the same dict as the Worker's; admission adds to it.
        reader: the request stream's Redis reads.
        replies: the loop connection's deferred replies (the reads that ride a step).
        admitter: turns a window's deliveries into engine requests.
        held: the message ids the worker holds (shared with the lease thread).
        cancels: the cancel watch whose check rides the step's reads.
        publisher: where admission's events, acknowledgements and dead letters go.
        metrics: the worker's metrics.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        engine,
        jobs: dict[str, Job],
        reader: StreamReader,
        replies: DeferredReplies,
        admitter: Admitter,
        held: HeldMessages,
        cancels: CancelWatch,
        publisher: Publisher | PublisherProcess,
        metrics: WorkerMetrics,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.jobs = jobs
        self.reader = reader
        self.replies = replies
        self.admitter = admitter
        self.held = held
        self.cancels = cancels
        self.publisher = publisher
        self.metrics = metrics
        self.window = BatchWindow(settings.batch_window_ms, settings.batch_window_gap_ms)
        self.need_own_pending = True  # this worker's own pending messages are read first (at start, after an outage)
        self.next_claim_at = 0.0  # when to look for dead workers' messages next (monotonic)
        self._sent: StepReadsSent | None = None
        # requests read beyond the free slots wait in the engine, ordered by priority; under fcfs they would gain
        # nothing there and only keep messages from other workers
        self.by_priority = settings.scheduling_policy == "priority"
        queued = settings.max_queued_seqs if self.by_priority else 0
        self.max_held = settings.max_num_seqs + queued

    # ---- the reads that ride a step ----------------------------------------------------------------------------
    def send_step_reads(self, free_kv_tokens: int, *, draining: bool) -> bool:
        """Own pending messages and claims (rare) are read at once; the cancel check and the read of new messages
        are only sent (worker/deferred_replies.py). Returns whether it reached Redis."""
        reached = False
        if not draining:
            reached = self.read(free_kv_tokens, deferred_new=True)
        cancel_ids = list(self.jobs)
        commands = self.cancels.commands(cancel_ids)
        num_cancel_commands = len(commands)
        free_slots = self.num_readable()
        read_new = not draining and free_slots > 0 and self.has_kv_room(free_kv_tokens)
        if read_new:
            commands.append(self.reader.read_new_command(free_slots))
        if not commands:
            return reached
        self.replies.send(commands)
        self._sent = StepReadsSent(cancel_ids, num_cancel_commands, read_new)
        return True

    @property
    def has_sent_reads(self) -> bool:
        """The last `send_step_reads` sent commands whose replies are not read yet."""
        return self._sent is not None

    def receive_step_reads(self) -> tuple[list[str], list] | None:
        """The replies of what `send_step_reads` sent: new messages go to the window. Returns the cancel check's
        (request ids, replies) for the loop to resolve, or None where nothing was sent."""
        sent, self._sent = self._sent, None
        if sent is None:
            return None
        replies = self.replies.receive()
        if sent.read_new:
            self.receive(self.reader.new_deliveries(replies[sent.num_cancel_commands]))
        return sent.cancel_ids, replies[: sent.num_cancel_commands]

    # ---- reading into the window ----------------------------------------------------------------------------------
    def num_readable(self) -> int:
        """Messages the worker may still read. Its slots (plus the queue the engine orders by priority) bound what it
        holds of priority 0 or below. Under the priority policy its background jobs (priority above 0: a batch's
        lines) do not count against them, so a worker full of batch lines still reads the interactive request
        behind a few more of them at the next step, and that request takes a line's slot (decision 0066).
        Background work is bounded by its sender (batch/stream_room.py) and here by as many again as the slots."""
        held = len(self.jobs) + len(self.window)
        if not self.by_priority:
            return self.max_held - held
        background = sum(1 for job in self.jobs.values() if job.priority > 0)
        return min(self.max_held - (held - background), 2 * self.max_held - held)

    def has_kv_room(self, free_kv_tokens: int) -> bool:
        """Read only while the KV pool has room beyond the prompts already waiting for it, so
        messages this worker could not start soon stay in the stream for other workers."""
        if not self.jobs:
            return True
        reserved = sum(job.num_prompt_tokens for job in self.jobs.values() if not job.started)
        return free_kv_tokens - reserved >= self.settings.block_size

    def block_ms(self) -> int | None:
        """How long a read may wait: never while the engine has work; up to the window's end while
        gathering; otherwise idle_block_ms, or until the next claim pass."""
        if self.engine.has_unfinished_requests():
            return None
        if len(self.window):
            return self.window.ms_left() or None
        until_claim_ms = int((self.next_claim_at - time.monotonic()) * 1000)
        return max(1, min(self.settings.idle_block_ms, until_claim_ms))

    def read(self, free_kv_tokens: int, *, deferred_new: bool = False) -> bool:
        """Own pending first, then abandoned messages, then new ones, into the window only (safe while the engine is
        mid-step); deferred_new leaves the read of new messages to the step's reads. Returns whether it reached
        Redis."""
        reached = False
        if self.need_own_pending:
            self.receive(self.reader.read_own_pending(max(1, self.num_readable())))
            self.need_own_pending, reached = False, True
        now = time.monotonic()
        if now >= self.next_claim_at and self.num_readable() > 0:
            self.next_claim_at = now + self.settings.claim_interval_ms / 1000
            self.receive(self.reader.claim_abandoned(self.num_readable()))
            reached = True
        if not deferred_new and self.num_readable() > 0 and self.has_kv_room(free_kv_tokens):
            self.receive(self.reader.read_new(self.num_readable(), self.block_ms()))
            reached = True
        return reached

    def receive(self, deliveries: list[Delivery]) -> None:
        fresh = self.held.add_new([d.message_id for d in deliveries])
        self.window.add([d for d in deliveries if d.message_id in fresh])

    # ---- admitting the window ---------------------------------------------------------------------------------------
    def admit_if_due(self) -> bool:
        """Admits the window once it is due; returns whether it did (and so reached Redis).

        NOTE: Admitter.admit does all its Redis reads before touching the engine, so a failure here leaves
        the window as it was, to be admitted on a later try."""
        if not len(self.window) or not self.window.is_due(self.num_readable()):
            return False
        self._admit(self.window.deliveries)
        self.window.take()
        return True

    def _admit(self, deliveries: list[Delivery]) -> None:
        admission = self.admitter.admit(deliveries, set(self.jobs))
        admitted = {job.message_id for job in admission.jobs}
        self.held.release([d.message_id for d in deliveries if d.message_id not in admitted])
        self.jobs.update((job.request_id, job) for job in admission.jobs)
        if admission.jobs:  # cancelled before they came in: the counter moved before the last check
            self.cancels.read_all_next()
        self.metrics.admitted.inc(len(admission.jobs))
        self.metrics.dead_letters.inc(admission.num_dead_letters)
        self.publisher.submit(admission.batch)
