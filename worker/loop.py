"""The worker: one engine, stepped continuously, with Redis at its edges.

Each iteration of `Worker.run`:
1. drop requests another worker took over (reported by the lease and publisher threads);
2. intake: read messages while there are sequence slots and KV room; the first arrival opens the
   batch window, and what arrives inside it is admitted together (see window.py);
3. drop not-yet-started requests past deadline;
4. one engine step; its outputs become events handed to the publisher (a child process by default;
   no Redis wait), after them the aborts of the requests found cancelled.
While the engine has work, the reads ride the steps: each step first sends its cancel check and
read of new messages without waiting (`MessageIntake.send_step_reads`, worker/deferred_replies.py), then
runs the engine, and reads their replies once the step's outputs are turned into events and handed to the
publisher, so the round trip overlaps the GPU and the loop's own work. No read outlives its step.
The next iteration admits the messages found. Reading and admitting are the Worker's MessageIntake
(worker/message_intake.py).

Redis going away never loses engine state: the loop's Redis calls back off and retry, the engine
keeps stepping, the publisher keeps the events until Redis is back.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from worker.admit import Admitter
from worker.cancel import CancelWatch
from worker.deferred_replies import DeferredReplies
from worker.event_publisher import Batch, Publisher
from worker.event_publisher_process import PublisherProcess
from worker.events_from_outputs import abort_events, events_for_outputs, write
from worker.heartbeat import Heartbeat, model_record, publish_model_info
from worker.held import HeldMessages
from worker.job import Job
from worker.lease import LeaseKeeper
from worker.message_intake import MessageIntake
from worker.metrics import WorkerMetrics
from worker.protocol import Keys, make_consumer_name
from worker.redis_client import CONNECTION_ERRORS, Backoff, make_client
from worker.settings import WorkerSettings
from worker.step_log import parent_id
from worker.stream_reader import StreamReader
from worker.worker_status import WorkerStatus

logger = logging.getLogger(__name__)

PUBLISHER_CLOSE_TIMEOUT_S = 5.0


class Worker:
    """Args:
    settings: worker settings.
    engine: an LLMEngine to use (tests share one); built from the settings when None.
    """

    def __init__(self, settings: WorkerSettings, engine=None) -> None:
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.consumer = settings.consumer or make_consumer_name()
        self._owns_engine = engine is None  # closed with the worker (a tensor-parallel group's other ranks)
        if engine is None:
            from engine import LLMEngine

            engine = LLMEngine(settings.engine_config())
        engine.constrained.timeout_s = settings.grammar_compile_timeout_s  # read when the compiler is built
        scheduling = engine.config.scheduler
        if (scheduling.policy, scheduling.max_background_seqs) != (settings.scheduling_policy,
                                                                    settings.max_background_seqs):  # fmt: skip
            # an engine built elsewhere (tests, benchmarks) schedules by its own config: say so, since the intake
            # reads by the settings' policy and the two disagreeing is easy to miss in a measurement
            logger.warning("the engine schedules by policy %r, background cap %s; the worker's settings ask for %r, %s",
                           scheduling.policy, scheduling.max_background_seqs, settings.scheduling_policy,
                           settings.max_background_seqs)  # fmt: skip
        self.engine = engine
        socket_timeout = max(5.0, 2 * settings.idle_block_ms / 1000)
        self.client = make_client(settings.redis_url, socket_timeout=socket_timeout)
        self.metrics = WorkerMetrics()
        self.held = HeldMessages()
        self.cancels = CancelWatch(self.keys)
        callbacks = {"on_lost": self.held.report_lost_request, "on_written": self._count_written}
        self.publisher: Publisher | PublisherProcess
        if settings.publisher_process:
            where = (settings.redis_url, socket_timeout, settings.prefix)
            self.publisher = PublisherProcess(*where, self.consumer, settings.result_ttl_s, **callbacks)
        else:
            self.publisher = Publisher(self.client, self.keys, self.consumer, settings.result_ttl_s, **callbacks)
        self.metrics.unwritten_batches.set_function(lambda: self.publisher.num_pending)
        self.lease = LeaseKeeper(
            self.client,
            self.keys,
            self.consumer,
            settings.lease_ms,
            held=self.held.snapshot,
            on_lost=self.held.report_lost_messages,
            on_renewed=self.metrics.lease_renewals.inc,
        )
        self.jobs: dict[str, Job] = {}  # request id -> job in the engine
        reader = StreamReader(self.client, self.keys, self.consumer, settings.lease_ms)
        admitter = Admitter(engine, self.client, self.keys, self.consumer, settings.max_deliveries,
                            settings.result_ttl_s)  # fmt: skip
        self.intake = MessageIntake(settings, engine, self.jobs, reader, DeferredReplies(self.client), admitter,
                                    self.held, self.cancels, self.publisher, self.metrics)  # fmt: skip
        self.status = WorkerStatus(engine, self.metrics, self.consumer, settings.model_name,
                                   lambda: len(self.intake.window), settings.max_num_seqs)  # fmt: skip
        self.step_log = self.status.step_log  # tests read the recent steps
        self.heartbeat = Heartbeat(
            self.client,
            self.keys,
            lambda: self.status.snapshot,
            settings.heartbeat_interval_s,
            settings.heartbeat_ttl_s,
            self.metrics,
            trim=self.intake.reader.trim_acknowledged if settings.trim_requests else None,
        )
        self.ready = threading.Event()  # set when the loop starts reading
        self.redis_backoff = Backoff()
        self._stop = threading.Event()
        self._drain_deadline: float | None = None

    # ---- control ---------------------------------------------------------------------------------
    def request_stop(self, *, force: bool = False) -> None:
        """Stop reading; finish running requests within shutdown_grace_s (force: at once), hand off the rest."""
        if force:
            self._drain_deadline = time.monotonic()
        self._stop.set()

    @property
    def is_draining(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        self._start()
        try:
            while True:
                if self.is_draining and not self._drain_step():
                    break
                self._iteration()
        finally:
            self._shutdown()

    # ---- start and stop ----------------------------------------------------------------------------
    def _start(self) -> None:
        self.metrics.serve(self.settings.metrics_port)
        info, tokenizer = model_record(self.engine, self.settings.model_name)
        while not self._stop.is_set():
            try:
                self.intake.reader.ensure_group()
                publish_model_info(self.client, self.keys, info, tokenizer)
                break
            except CONNECTION_ERRORS as exc:
                logger.warning("Redis at %s unavailable (%s); retrying", self.settings.redis_url, exc)
                time.sleep(self.redis_backoff.failure())
        self.redis_backoff.success()
        self.publisher.start()
        self.lease.start()
        self.heartbeat.start()
        logger.info("worker %s serving %s from %s", self.consumer, self.settings.model_name, self.keys.requests)
        self.ready.set()

    def _drain_step(self) -> bool:
        """During shutdown: hand off what has not started; False once nothing is left or grace is over."""
        now = time.monotonic()
        if self._drain_deadline is None:
            self._drain_deadline = now + self.settings.shutdown_grace_s
            logger.info("stopping: finishing running requests for up to %.1fs", self.settings.shutdown_grace_s)
        self._hand_off(lambda job: not job.started or now >= self._drain_deadline)
        return bool(self.jobs)

    def _hand_off(self, which) -> None:
        """Give messages back to the group at once: they look idle, so a live worker claims them now
        and resumes them from their result streams."""
        batch = Batch(handoffs=[d.message_id for d in self.intake.window.take()])
        for job in [job for job in self.jobs.values() if which(job)]:
            self.engine.abort_request(job.request_id)
            del self.jobs[job.request_id]
            batch.handoffs.append(job.message_id)
        if not batch.handoffs:
            return
        with self.lease.renew_lock:  # no renewal may land after the hand-off
            self.held.release(batch.handoffs)
        logger.info("handing off %d message(s)", len(batch.handoffs))
        self.publisher.submit(batch)

    def _shutdown(self) -> None:
        self._hand_off(lambda job: True)
        self.lease.stop()
        if not self.publisher.close(PUBLISHER_CLOSE_TIMEOUT_S):
            logger.error("exiting with %d unwritten batch(es); they resume elsewhere", self.publisher.num_pending)
        self.heartbeat.stop()
        self.intake.replies.close()
        self.client.close()
        if self._owns_engine:
            self.engine.close()
        logger.info("worker %s stopped", self.consumer)

    # ---- one iteration -----------------------------------------------------------------------------
    def _iteration(self) -> None:
        self._drop_lost()
        if self.engine.has_unfinished_requests():
            # Busy: new messages were read over the last step (the step's reads); admitting them
            # changes the engine, so it happens here.
            self._admit_if_due()
        elif not self.is_draining:
            self._intake()
        self._drop_late()
        if self.engine.has_unfinished_requests():
            self._step()  # the cancel check rides the step
        elif self.jobs and self._redis_usable():
            self._redis_call(self._check_cancels)
        elif self.redis_backoff.is_failing:
            time.sleep(0.02)  # idle while Redis is away: do not spin

    def _redis_usable(self) -> bool:
        return not self.redis_backoff.is_failing or self.redis_backoff.may_retry

    def _redis_call(self, fn) -> None:
        """Run fn (which returns whether it reached Redis); on connection errors, back off."""
        try:
            reached = fn()
        except CONNECTION_ERRORS as exc:
            self.metrics.redis_errors.inc()
            delay = self.redis_backoff.failure()
            logger.warning("Redis unavailable (%s); engine keeps running, retrying in %.2fs", exc, delay)
            return
        except redis.ResponseError as exc:  # OOM, READONLY during a failover: wait it out like an outage
            self.metrics.redis_errors.inc()
            delay = self.redis_backoff.failure()
            logger.error("Redis refused a command (%s); engine keeps running, retrying in %.2fs", exc, delay)
            return
        if reached and self.redis_backoff.is_failing:
            logger.info("Redis is back")
            self.intake.need_own_pending = True  # messages delivered to us that we may not hold
            self.redis_backoff.success()

    # ---- intake (worker/message_intake.py) ---------------------------------------------------------------------
    def _intake(self) -> None:
        if self._redis_usable():
            self._redis_call(self._read_and_admit)
        elif not self.engine.has_unfinished_requests():
            time.sleep(min(0.05, max(0.0, self.redis_backoff.retry_at - time.monotonic())))

    def _read_and_admit(self) -> bool:
        """Own pending first, then abandoned messages, then new ones. Returns whether it reached Redis."""
        reached = self.intake.read(self.status.stats.num_free_kv_tokens)
        return self._admit_window_if_due() or reached

    def _admit_if_due(self) -> None:
        """While busy: admit what the reads during the last step gathered, once the window is due."""
        if self._redis_usable():
            self._redis_call(self._admit_window_if_due)

    def _admit_window_if_due(self) -> bool:
        admitted = self.intake.admit_if_due()
        if admitted:
            self.status.refresh_snapshot()
        return admitted

    def _send_reads_for_step(self) -> None:
        """Send the step's reads (new messages, the cancel check) without waiting, before the engine
        schedules it; `_finish_step_reads` reads their replies after the step's outputs."""
        try:
            if self._redis_usable():
                free_kv_tokens = self.status.stats.num_free_kv_tokens
                self._redis_call(lambda: self.intake.send_step_reads(free_kv_tokens, draining=self.is_draining))
        except Exception:  # a bug here must not fail the step's requests
            logger.exception("sending a step's reads to Redis failed")

    # ---- cancels, deadlines, takeovers -------------------------------------------------------------
    def _check_cancels(self) -> bool:
        """A cancel check in round trips of its own, while no step runs (nothing else would read it)."""
        batch = Batch()
        self._abort_cancelled(self.cancels.check(self.client, list(self.jobs)), batch)
        self.publisher.submit(batch)
        if batch.events:
            self.status.refresh()
        return True

    def _finish_step_reads(self, batch: Batch) -> bool:
        """After a step's outputs: read the replies of what the step's reads sent (new messages go to the
        window; cancels are aborted, their events and acks into `batch`, which is submitted after the step's
        own). Where nothing was sent (no commands, or Redis was away), the cancels are checked in round trips
        of their own."""
        received = self.intake.receive_step_reads()
        if received is None:  # the round trips the step could not carry
            if not self.jobs:
                return False
            self._abort_cancelled(self.cancels.check(self.client, list(self.jobs)), batch)
            return True
        cancel_ids, cancel_replies = received
        if cancel_replies:
            self._abort_cancelled(self.cancels.cancelled(self.client, cancel_ids, cancel_replies), batch)
        return True

    def _abort_cancelled(self, request_ids: list[str], batch: Batch) -> None:
        for request_id in request_ids:
            job = self.jobs.get(request_id)
            if job is None:  # finished in the step the check rode
                continue
            batch.events += abort_events(job, self.engine.abort_request(request_id), self.consumer)
            self._finish(job, batch, "abort")
            self.metrics.aborts.inc()

    def _drop_late(self) -> None:
        """Deadlines bind only until a request starts: one that waited too long is dropped before prefill."""
        now = time.time()
        late = [j for j in self.jobs.values() if not j.started and j.deadline is not None and now > j.deadline]
        batch = Batch()
        for job in late:
            self.engine.abort_request(job.request_id)
            message = f"deadline passed {now - job.deadline:.3f}s before the request started"
            batch.events.append(write(job, job.error_event(message, self.consumer)))
            self._finish(job, batch, "deadline")
        self.publisher.submit(batch)
        if late:
            self.status.refresh()

    def _drop_lost(self) -> None:
        """Another worker owns these now (we froze past our lease): stop working on them, silently."""
        for kind, lost_id in self.held.drain_lost():
            if kind == "message":
                self.intake.window.remove(lost_id)
                self.held.release([lost_id])
                job = next((j for j in self.jobs.values() if j.message_id == lost_id), None)
            else:
                job = self.jobs.get(lost_id)
            if job is not None:
                self.engine.abort_request(job.request_id)
                self._forget(job)
                self.metrics.lost.inc()

    # ---- stepping ----------------------------------------------------------------------------------
    def _step(self) -> None:
        # NOTE: the step's reads go out first, before the engine schedules it: Redis answers them before the
        # publisher's script of the last step's events reaches it, and their replies have the whole step to
        # come back (decision 0025).
        self._send_reads_for_step()
        started = time.monotonic()
        outputs = self.engine.step()
        self.metrics.step_seconds.observe(time.monotonic() - started)
        record = self.engine.last_step
        for internal_id in record.new_request_ids:
            job = self.jobs.get(parent_id(internal_id))
            if job is not None:
                job.started = True
        batch, finished = events_for_outputs(self.jobs, outputs, self.consumer)
        for job in finished:
            last = next(e.event for e in reversed(batch.events) if e.request_id == job.request_id)
            self._finish(job, batch, last.finish_reason or "error")
        # NOTE: the step's events go to the publisher before the loop reads the replies of the step's
        # reads, so that the tokens reach the clients sooner. Aborts of cancelled requests follow in a
        # batch of their own, after this step's tokens.
        self.publisher.submit(batch)
        if self.intake.has_sent_reads or (self.jobs and self._redis_usable()):
            aborts = Batch()
            self._redis_call(lambda: self._finish_step_reads(aborts))
            self.publisher.submit(aborts)

        self.status.after_step(list(self.jobs))

    def _finish(self, job: Job, batch: Batch, reason: str) -> None:
        """The terminal events are in `batch`; acknowledge after them (same MULTI) and let go."""
        self.engine.abort_request(job.request_id)  # frees choices skipped on resume, if any still run
        batch.acks.append(job.message_id)
        self._forget(job)
        self.metrics.finished.labels(reason=reason).inc()

    def _forget(self, job: Job) -> None:
        self.jobs.pop(job.request_id, None)
        self.held.release([job.message_id])

    # ---- shared with the threads -------------------------------------------------------------------
    def _count_written(self, num_events: int, num_duplicates: int) -> None:
        self.metrics.events_written.inc(num_events - num_duplicates)
        self.metrics.duplicate_events.inc(num_duplicates)
