"""The publisher in its own process: the engine loop hands batches over a pipe and never shares
a GIL with the Redis writes.

Why: as a thread, the publisher's Python work (encoding ~256 events per step, packing, reading
replies) took the GIL at the engine loop's first release after each step (every torch call
drops it) and so ran in series with the loop's own host work instead of beside the GPU
(decision 0024).

Same interface and guarantees as worker.event_publisher.Publisher (submit, flush, close, num_pending,
on_lost, on_written), with the writing itself done by that class's `write` in the child:
- batches are written in submission order; consecutive queued ones are merged (worker.event_publisher.merge_queued);
- a batch stays in `_unacknowledged` until the child reports it written, so a child that dies
  is restarted and given every unacknowledged batch again (explicit event ids make the rewrite
  exactly-once; acks and hand-offs are idempotent);
- the child exits when the pipe closes, and within PARENT_CHECK_S of its worker's death even
  while Redis is away: what it still has buffered is written within milliseconds (Redis up),
  long before any lease runs out and another worker resumes those requests.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import operator
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection

from worker.event_columns import TokenEvents
from worker.event_publisher import Batch, EventWrite, SubmissionCounter, merge_queued
from worker.protocol import ResultEvent

logger = logging.getLogger(__name__)

CHILD_START_TIMEOUT_S = 30.0
RESTART_DELAY_S = 0.5
PARENT_CHECK_S = 0.5

# Batches cross the pipe as plain tuples: pickling them costs half of pickling the dataclasses,
# and the engine loop pays it for every event.
_EVENT_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ResultEvent)))


def _pack(batch: Batch) -> tuple:
    """The step's token events cross as their columns (worker/event_columns.py), the other events as tuples."""
    events = [(w.request_id, w.stream, w.channel, _EVENT_FIELDS(w.event)) for w in batch.events]
    tokens = [(position, columns.as_tuple()) for position, columns in batch.tokens]
    return tokens, events, batch.dead_letters, batch.acks, batch.handoffs


def _unpack(wire: tuple) -> Batch:
    tokens, events, dead_letters, acks, handoffs = wire
    writes = [EventWrite(rid, stream, channel, ResultEvent(*fields)) for rid, stream, channel, fields in events]
    columns = [(position, TokenEvents.from_tuple(values)) for position, values in tokens]
    return Batch(events=writes, dead_letters=dead_letters, acks=acks, handoffs=handoffs, tokens=columns)


def _child_main(conn, redis_url: str, socket_timeout: float, prefix: str, consumer: str, result_ttl_s: int) -> None:
    """The child: receive batches, write them, report back. Stops on None or when the pipe closes."""
    # NOTE: the worker's SIGINT/SIGTERM go to its process group; the child stops when the worker
    # closes the pipe, after the worker's own hand-off batches are written, not on the signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from worker.event_publisher import Publisher
    from worker.protocol import Keys
    from worker.redis_client import make_client

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            conn.send(message)

    writer = Publisher(
        make_client(redis_url, socket_timeout=socket_timeout),
        Keys(prefix),
        consumer,
        result_ttl_s,
        on_lost=lambda request_id: send(("lost", request_id)),
        on_written=lambda num_events, num_duplicates: send(("written", num_events, num_duplicates)),
    )
    parent = os.getppid()

    def exit_with_parent() -> None:
        # The pipe's EOF ends the loop below, but not a write retrying through a Redis outage:
        # a child whose worker is gone must not live on (its requests resume elsewhere).
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=exit_with_parent, name="inferq-publisher-parent", daemon=True).start()
    send(("ready",))
    stop = False

    def take_more() -> Batch | None:
        nonlocal stop
        if stop or not conn.poll():
            return None
        wire = conn.recv()
        stop = wire is None
        return None if stop else _unpack(wire)

    held: Batch | None = None  # received but left out of the last write (merge_queued's event cap)
    while True:
        if held is not None:
            first, held = held, None
        else:
            try:
                wire = conn.recv()
            except (EOFError, OSError):
                return
            if wire is None:
                return
            first = _unpack(wire)
        merged, count, held = merge_queued(first, take_more)
        writer.write(merged)
        send(("done", count))
        if stop:  # the stop came after every batch of this write (a held batch ends a merge before it)
            return


class PublisherProcess:
    """Args:
    redis_url, socket_timeout: how the child connects (it builds its own client).
    prefix, consumer, result_ttl_s, on_lost, on_written: as for worker.event_publisher.Publisher;
        the callbacks run on this process's pipe-reader thread.
    """

    def __init__(
        self,
        redis_url: str,
        socket_timeout: float,
        prefix: str,
        consumer: str,
        result_ttl_s: int,
        on_lost: Callable[[str], None],
        on_written: Callable[[int, int], None] | None = None,
    ) -> None:
        self._child_args = (redis_url, socket_timeout, prefix, consumer, result_ttl_s)
        self.on_lost = on_lost
        self.on_written = on_written
        self.submissions = SubmissionCounter()
        self._lock = threading.Lock()  # the child's process and pipe, and the batches it has not confirmed
        self._unacknowledged: deque[tuple] = deque()  # packed batches the child has not confirmed
        self._stopping = False
        self._process = None
        self._conn = None
        self._reader: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._spawn()

    def _spawn(self) -> None:
        # A fresh interpreter (not fork: the worker holds CUDA and threads; not multiprocessing's
        # spawn: it re-imports the parent's __main__) with one end of a socket pair as its pipe.
        ours, theirs = socket.socketpair()
        redis_url, socket_timeout, prefix, consumer, result_ttl_s = self._child_args
        argv = [sys.executable, "-m", "worker.event_publisher_process", "--fd", str(theirs.fileno()),
                "--socket-timeout", str(socket_timeout), "--prefix", prefix, "--consumer", consumer,
                "--result-ttl-s", str(result_ttl_s)]  # fmt: skip
        # the URL may hold a password: it goes through the environment, not the command line
        env = {**os.environ, "INFERQ_PUBLISHER_REDIS_URL": redis_url}
        process = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        conn = Connection(ours.detach())
        if not conn.poll(CHILD_START_TIMEOUT_S) or conn.recv() != ("ready",):
            process.kill()
            raise RuntimeError("the publisher process did not start")
        with self._lock:
            self._process, self._conn = process, conn
            for wire in self._unacknowledged:  # a restart: everything not yet confirmed, in order
                conn.send(wire)
        self._reader = threading.Thread(target=self._read, args=(conn,), name="inferq-publisher-acks", daemon=True)
        self._reader.start()

    @property
    def num_pending(self) -> int:
        """Batches submitted and not yet confirmed written by the child."""
        return self.submissions.num_pending

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        return self.submissions.wait(timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Flush (up to timeout_s), then stop the child. Returns whether everything was written."""
        flushed = self.flush(timeout_s)
        with self._lock:
            self._stopping = True
            conn, process = self._conn, self._process
        if conn is not None:
            with contextlib.suppress(OSError):  # the child is gone already
                conn.send(None)
        if process is not None:
            try:
                process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return flushed

    # ---- the loop's side -------------------------------------------------------------------------
    def submit(self, batch: Batch) -> None:
        """Queue a batch; returns once the pipe has taken it (blocks only if the child falls far behind)."""
        if not batch:
            return
        wire = _pack(batch)
        self.submissions.submitted()
        with self._lock:
            self._unacknowledged.append(wire)
            conn = self._conn
        if conn is None:  # the child is being restarted: it will be sent everything unacknowledged
            return
        with contextlib.suppress(OSError):  # the child is gone: the reader restarts it and resends _unacknowledged
            conn.send(wire)

    # ---- the pipe reader -------------------------------------------------------------------------
    def _read(self, conn) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "done":
                with self._lock:
                    for _ in range(message[1]):
                        self._unacknowledged.popleft()
                self.submissions.done(message[1])
            elif kind == "lost":
                self.on_lost(message[1])
            elif kind == "written" and self.on_written is not None:
                self.on_written(message[1], message[2])
        with self._lock:
            if self._stopping:
                return
            self._conn = None
        logger.error("the publisher process died (exit code %s); restarting it", self._process.wait())
        while True:
            time.sleep(RESTART_DELAY_S)
            try:
                self._spawn()
                return
            except Exception:  # noqa: BLE001 - keep trying: the batches wait in _unacknowledged
                logger.exception("cannot restart the publisher process")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="inferq's publisher child (started by the worker)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--socket-timeout", type=float, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--result-ttl-s", type=int, required=True)
    args = parser.parse_args(argv)
    url = os.environ["INFERQ_PUBLISHER_REDIS_URL"]
    _child_main(Connection(args.fd), url, args.socket_timeout, args.prefix, args.consumer, args.result_ttl_s)


if __name__ == "__main__":
    main()
