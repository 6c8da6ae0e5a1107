"""The publisher's child process against a real private Redis: order, exactly once, takeovers
reported back, and a child killed mid-run restarted with every unconfirmed batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.worker.harness import read_events
from worker.event_publisher import Batch, EventWrite
from worker.event_publisher_process import PublisherProcess
from worker.protocol import Keys, ResultEvent


def _token(seq: int, token: int, worker: str = "w1") -> ResultEvent:
    return ResultEvent(seq=seq, type="token", text=f"t{token}", token_ids=[token], worker=worker)


def _write(keys: Keys, request_id: str, *events: ResultEvent) -> Batch:
    stream, channel = keys.result(request_id), keys.events(request_id)
    return Batch(events=[EventWrite(request_id, stream, channel, e) for e in events])


def _publisher(redis_server, prefix):
    lost: list[str] = []
    written: list[tuple[int, int]] = []
    publisher = PublisherProcess(
        redis_server.url, 5.0, prefix, "w1", 60, lost.append, lambda n, d: written.append((n, d))
    )
    publisher.start()
    return publisher, lost, written


def test_child_writes_in_order_once_and_reports_takeovers(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    publisher, lost, written = _publisher(redis_server, prefix)
    try:
        for seq in range(1, 51):
            publisher.submit(_write(keys, "r1", _token(seq, 100 + seq)))
        publisher.submit(_write(keys, "r1", _token(50, 150)))  # a rewrite: already there
        client.xadd(keys.result("r2"), {"v": "1", "seq": "1", "type": "token", "token_ids": "[5]", "worker": "w2"},
                    id="0-1")  # fmt: skip
        publisher.submit(_write(keys, "r2", _token(1, 99)))
        assert publisher.flush(10)
        assert publisher.num_pending == 0
        assert [e.token_ids[0] for _, e in read_events(client, keys, "r1")] == list(range(101, 151))
        assert sum(n for n, _ in written) == 52 and sum(d for _, d in written) == 2
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:  # reported on the pipe-reader thread
            time.sleep(0.01)
        assert lost == ["r2"]
    finally:
        assert publisher.close(5)
    assert publisher._process.poll() is not None  # the child exited


def test_a_killed_child_is_restarted_with_every_unconfirmed_batch(redis_server, prefix):
    keys, client = Keys(prefix), redis_server.client()
    publisher, _, _ = _publisher(redis_server, prefix)
    try:
        publisher.submit(_write(keys, "r1", _token(1, 1)))
        assert publisher.flush(10)
        first = publisher._process
        os.kill(first.pid, signal.SIGSTOP)  # frozen: what is submitted now stays unconfirmed
        for seq in range(2, 21):
            publisher.submit(_write(keys, "r1", _token(seq, seq)))
        assert publisher.num_pending == 19
        os.kill(first.pid, signal.SIGKILL)
        assert publisher.flush(30)
        assert publisher._process.pid != first.pid
        assert [e.token_ids[0] for _, e in read_events(client, keys, "r1")] == list(range(1, 21))
        publisher.submit(_write(keys, "r1", _token(21, 21)))  # and the new child keeps going
        assert publisher.flush(10)
        assert len(read_events(client, keys, "r1")) == 21
    finally:
        publisher.close(5)


PARENT_SCRIPT = """
import os, sys, time
from worker.protocol import ResultEvent
from worker.event_publisher import Batch, EventWrite
from worker.event_publisher_process import PublisherProcess
publisher = PublisherProcess(sys.argv[1], 1.0, "p", "w1", 60, lambda request_id: None)
publisher.start()
event = ResultEvent(seq=1, type="token", text="x", token_ids=[1], worker="w1")
publisher.submit(Batch(events=[EventWrite("r1", "p:result:r1", "p:events:r1", event)]))
print(publisher._process.pid, flush=True)
time.sleep(1.0)  # the child is now retrying its write against a Redis that is not there
os._exit(0)  # the worker dies without closing anything
"""


def test_the_child_does_not_outlive_its_worker_while_redis_is_away():
    from tests.redis_server import free_port

    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run([sys.executable, "-c", PARENT_SCRIPT, dead_redis], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    child = int(result.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the publisher child outlived its worker"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")  # a zombie is gone
