"""Writes events, dead letters, acknowledgements and hand-offs to Redis beside the engine loop.

The loop hands over one `Batch` per step and never waits. A background thread writes batches
in order, each as one MULTI/EXEC, so a finishing token, its "done" event and the XACK land
together or not at all. Consecutive queued batches are merged into one round trip (up to MAX_MERGED_EVENTS events).

Exactly once: result events are XADDed with explicit ids "0-{seq}". A retry after a lost reply
(or another worker that resumed the request) gets "ID equal or smaller" back: the event is
already there. When the entry there was written by a different worker, this worker has lost
the request; `on_lost(request_id)` tells the loop to drop its copy.

The events of a batch go to Redis as one Lua call (worker/event_write_script.py): per-command packing
and reply parsing in Python cost more GIL than the engine loop could spare at full batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from worker.event_columns import TokenEvents
from worker.event_write_script import write_events_args
from worker.protocol import Keys, ResultEvent, encode_event_for_write, encode_token_for_write, stream_id
from worker.redis_client import CONNECTION_ERRORS, Backoff, is_duplicate_id

logger = logging.getLogger(__name__)

# XCLAIM ... IDLE: a handed-off message looks idle this long, so any live worker's XAUTOCLAIM
# takes it at once instead of waiting out the lease.
HANDOFF_IDLE_MS = 10**10
MAX_MERGED_BATCHES = 64
# NOTE: a publisher that fell behind merges the steps queued since into one write, but no further than this many
# events (a batch is never split: its acks ride the MULTI of its events). Redis runs one script to the end before
# it answers anyone else, so an unbounded merge of many full-batch steps holds every other client, the worker
# loop's step reads among them, for as long as it runs; two steps' worth bounds that to a few ms, and the
# per-write overhead the merge saves is small next to the events' own cost (decision 0024).
MAX_MERGED_EVENTS = 512
DEAD_LETTER_MAXLEN = 100_000  # approximate cap of the dead-letter stream
# A result stream's EXPIRE (and its request id's owner key's) is refreshed when this fraction of its TTL has
# passed since the last refresh (and on every terminal event), not on every write: a stream then never
# expires while its request runs, lives result_ttl_s after its last event, and costs no EXPIRE per token.
EXPIRE_REFRESH_FRACTION = 0.25


@dataclass(slots=True)
class EventWrite:
    request_id: str
    stream: str
    channel: str
    event: ResultEvent


@dataclass
class Batch:
    """What one engine step owes Redis, written in this order: its events (`tokens`, the step's token events in
    columns, worker/event_columns.py, then `events`), dead letters, acks, hand-offs.

    `tokens` holds (position, columns) pairs: those token events are written before events[position:]. A step's
    batch has at most one, at 0; merged batches (`extend`) keep each batch's own, so that the publisher encodes
    columns straight into the script's arguments however far behind it is."""

    events: list[EventWrite] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    handoffs: list[str] = field(default_factory=list)
    tokens: list[tuple[int, TokenEvents]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tokens or self.events or self.dead_letters or self.acks or self.handoffs)

    def segments(self) -> list[TokenEvents | list[EventWrite]]:
        """The batch's events in write order, as runs of columns and of EventWrites."""
        runs: list[TokenEvents | list[EventWrite]] = []
        done = 0
        for position, columns in self.tokens:
            if position > done:
                runs.append(self.events[done:position])
                done = position
            runs.append(columns)
        if done < len(self.events):
            runs.append(self.events[done:])
        return runs

    @property
    def num_events(self) -> int:
        return len(self.events) + sum(len(columns) for _, columns in self.tokens)

    def extend(self, other: Batch) -> None:
        """Appends a later batch: its events (token events and the rest, in their order) after this one's."""
        offset = len(self.events)
        self.tokens += [(position + offset, columns) for position, columns in other.tokens]
        self.events += other.events
        self.dead_letters += other.dead_letters
        self.acks += other.acks
        self.handoffs += other.handoffs


def merge_queued(first: Batch, take_more: Callable[[], Batch | None]) -> tuple[Batch, int, Batch | None]:
    """One write's worth of queued batches: `first`, then those `take_more` hands over (None: no more now) while
    the merge stays within MAX_MERGED_BATCHES batches and MAX_MERGED_EVENTS events. Returns (the merged batch, how
    many batches it holds, the batch taken that would have passed the event cap: the next write's first, or None).
    """
    merged, count, num_events = first, 1, first.num_events
    while count < MAX_MERGED_BATCHES:
        more = take_more()
        if more is None:
            break
        if num_events + more.num_events > MAX_MERGED_EVENTS:
            return merged, count, more
        merged.extend(more)
        count += 1
        num_events += more.num_events
    return merged, count, None


class SubmissionCounter:
    """How many batches were submitted and how many are written, for `num_pending` and `flush` (each publisher,
    the thread here and worker/event_publisher_process.py, owns one)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._num_submitted = 0
        self._num_done = 0

    @property
    def num_pending(self) -> int:
        with self._lock:
            return self._num_submitted - self._num_done

    def submitted(self) -> None:
        """One batch more to write; called before it is handed to the writing side."""
        with self._lock:
            self._num_submitted += 1

    def done(self, count: int) -> None:
        """`count` batches written (the writing side)."""
        with self._lock:
            self._num_done += count
            self._lock.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            target = self._num_submitted
            while self._num_done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True


class Publisher:
    """Args:
    client: Redis client (thread-safe pool).
    keys: key names.
    consumer: this worker's consumer name (marks its events; owns its hand-offs).
    result_ttl_s: a result stream expires this long after its last event (EXPIRE is refreshed on
        terminal events and every EXPIRE_REFRESH_FRACTION of it while the stream is written).
    on_lost: called from the publisher thread with a request id another worker now writes.
    on_written: called with (num_events, num_duplicates) after each successful write (metrics).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        consumer: str,
        result_ttl_s: int,
        on_lost: Callable[[str], None],
        on_written: Callable[[int, int], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.result_ttl_s = result_ttl_s
        self.on_lost = on_lost
        self.on_written = on_written
        self.submissions = SubmissionCounter()
        self._queue: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferq-publisher", daemon=True)
        self.backoff = Backoff()
        self._expire_refreshed: dict[str, float] = {}  # result stream -> monotonic time of its last EXPIRE

    def start(self) -> None:
        self._thread.start()

    @property
    def num_pending(self) -> int:
        """Batches submitted and not yet written."""
        return self.submissions.num_pending

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        return self.submissions.wait(timeout_s)

    def submit(self, batch: Batch) -> None:
        """Queue a batch; returns at once."""
        if not batch:
            return
        self.submissions.submitted()
        self._queue.put(batch)

    def close(self, timeout_s: float) -> bool:
        """Flush (up to timeout_s), then stop the thread. Returns whether everything was written."""
        flushed = self.flush(timeout_s)
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=1.0)
        return flushed

    # ---- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        held: Batch | None = None  # taken from the queue but left out of the last write (merge_queued)
        while True:
            batch = held if held is not None else self._queue.get()
            if batch is None:
                return
            merged, count, held = merge_queued(batch, self._take_queued)
            self.write(merged)
            self.submissions.done(count)

    def _take_queued(self) -> Batch | None:
        try:
            more = self._queue.get_nowait()
        except queue.Empty:
            return None
        if more is None:
            self._queue.put(None)  # stop after this write
        return more

    def write(self, batch: Batch) -> None:
        """Write one batch now, retrying through Redis outages (the thread's body; the publisher
        process calls it directly)."""
        while True:
            try:
                self._write(batch)
                self.backoff.success()
                return
            except CONNECTION_ERRORS as exc:
                delay = self.backoff.failure()
                logger.warning("publisher: Redis unavailable (%s), retrying in %.2fs", exc, delay)
            except redis.ResponseError as exc:  # the server refused the whole MULTI (OOM, READONLY failover)
                delay = self.backoff.failure()
                logger.error("publisher: Redis refused the write (%s), retrying in %.2fs", exc, delay)
            except Exception:  # a bug must not wedge the queue: log it and drop the batch
                logger.exception("publisher: dropping a batch that cannot be written")
                return
            if self._stop.wait(delay):
                logger.error("publisher stopped with %d unwritten event(s)", batch.num_events)
                return

    def _write(self, batch: Batch) -> None:
        writes, owners = self._event_writes(batch)
        pipe = self.client.pipeline(transaction=True)
        if writes:
            pipe.execute_command("EVAL", *write_events_args(self.result_ttl_s, writes))
        # The request id stays owned (worker/admit.py) as long as its result stream lives: its key's expiry is
        # refreshed with the stream's.
        for request_id in dict.fromkeys(rid for (rid, _, _), write in zip(owners, writes, strict=True) if write[4]):
            pipe.expire(self.keys.owner(request_id), self.result_ttl_s)
        for letter in batch.dead_letters:
            pipe.xadd(self.keys.dead, letter, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
        if batch.acks:
            pipe.xack(self.keys.requests, self.keys.group, *batch.acks)
        for message_id in batch.handoffs:
            pipe.xclaim(
                self.keys.requests, self.keys.group, self.consumer, 0, [message_id], idle=HANDOFF_IDLE_MS, justid=True
            )
        results = pipe.execute(raise_on_error=False)
        num_duplicates = 0
        if writes:
            statuses, results = results[0], results[1:]
            if isinstance(statuses, Exception):  # the script itself was refused: retry the batch (ids dedupe)
                self._expire_refreshed.clear()
                raise statuses
            for (request_id, stream, seq), status in zip(owners, statuses, strict=True):
                if status == 1:
                    continue
                if is_duplicate_id(status):
                    num_duplicates += 1
                    self._check_owner(request_id, stream, seq)
                else:
                    logger.error("cannot write event %d of %s to %s: %r", seq, request_id, stream, status)
        for result in results:
            if isinstance(result, Exception):
                logger.error("publisher: Redis refused a command: %s", result)
        if self.on_written is not None:
            self.on_written(len(writes), num_duplicates)

    def _event_writes(self, batch: Batch) -> tuple[list[tuple], list[tuple[str, str, int]]]:
        """The script's (stream, id, channel, payload, expire, fields) for every event of the batch, in write order,
        and each one's (request id, stream, seq). Token events without logprobs (or prompt logprobs) are encoded
        straight from their columns (encode_token_for_write); the rest through their ResultEvent."""
        now = time.monotonic()
        refresh_after = self.result_ttl_s * EXPIRE_REFRESH_FRACTION
        refreshed = self._expire_refreshed
        writes: list[tuple] = []
        owners: list[tuple[str, str, int]] = []
        for run in batch.segments():
            if isinstance(run, TokenEvents):
                worker, prompts = run.worker, run.prompt_logprobs
                for position, (rid, stream, channel, seq, index, text, tokens, logprobs) in enumerate(zip(
                    run.request_ids, run.streams, run.channels, run.seqs, run.indexes, run.texts, run.token_ids,
                    run.logprobs, strict=True,
                )):  # fmt: skip
                    prompt = prompts.get(position) if prompts else None
                    if logprobs is None and prompt is None:
                        fields, payload = encode_token_for_write(seq, index, text, tokens, worker)
                    else:
                        event = ResultEvent(
                            seq, "token", index, text, tokens, logprobs, None, None, None, worker, prompt
                        )
                        fields, payload = encode_event_for_write(event)
                    last = refreshed.get(stream)  # a token event is never terminal
                    expire = last is None or now - last >= refresh_after
                    if expire:
                        refreshed[stream] = now
                    writes.append((stream, stream_id(seq), channel, payload, expire, fields))
                    owners.append((rid, stream, seq))
                continue
            for write in run:
                fields, payload = encode_event_for_write(write.event)
                terminal = write.event.is_terminal_for_choice
                last = refreshed.get(write.stream)
                expire = terminal or last is None or now - last >= refresh_after
                if terminal:
                    refreshed.pop(write.stream, None)
                elif expire:
                    refreshed[write.stream] = now
                writes.append((write.stream, stream_id(write.event.seq), write.channel, payload, expire, fields))
                owners.append((write.request_id, write.stream, write.event.seq))
        return writes, owners

    def _check_owner(self, request_id: str, stream: str, seq: int) -> None:
        """A duplicate id is our own earlier write (a retry) or another worker's: only the latter is a loss."""
        sid = stream_id(seq)
        entries = self.client.xrange(stream, min=sid, max=sid)
        if not entries:
            return
        writer = entries[0][1].get(b"worker", b"").decode()
        if writer and writer != self.consumer:
            logger.warning("request %s: seq %d was written by %s; dropping local copy", request_id, seq, writer)
            self.on_lost(request_id)
