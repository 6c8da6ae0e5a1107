"""A publisher that fell behind merges the queued steps into few writes, but no write passes MAX_MERGED_EVENTS
events (Redis answers no one else while it runs one): the merge rule alone, then the thread publisher and the
publisher process against a real private Redis with a backlog made on purpose."""

from __future__ import annotations

import os
import signal

from tests.worker.harness import read_events
from worker.event_publisher import MAX_MERGED_BATCHES, MAX_MERGED_EVENTS, Batch, EventWrite, Publisher, merge_queued
from worker.event_publisher_process import PublisherProcess
from worker.protocol import Keys, ResultEvent


def _step(keys: Keys, step: int, num_requests: int) -> Batch:
    """One step's token events: the step's token (seq step + 1) for each of num_requests requests."""
    events = []
    for r in range(num_requests):
        request_id = f"r{r}"
        event = ResultEvent(seq=step + 1, type="token", text=f"t{step}", token_ids=[step], worker="w1")
        events.append(EventWrite(request_id, keys.result(request_id), keys.events(request_id), event))
    return Batch(events=events)


def _queue(batches: list[Batch]):
    return lambda: batches.pop(0) if batches else None


def test_a_merge_stops_before_the_batch_that_would_pass_the_event_cap() -> None:
    keys = Keys("merge")
    size = MAX_MERGED_EVENTS // 2 - 6  # two fit, a third does not
    queued = [_step(keys, s, size) for s in range(1, 5)]
    third = queued[1]
    merged, count, held = merge_queued(_step(keys, 0, size), _queue(queued))
    assert count == 2 and merged.num_events == 2 * size and held is third
    assert len(queued) == 2  # the rest stay queued for the writes after
    # a step larger than the cap is written whole (a batch is never split from its acks)
    big = _step(keys, 0, MAX_MERGED_EVENTS + 10)
    merged, count, held = merge_queued(big, _queue([_step(keys, 1, 1)]))
    assert (count, merged.num_events) == (1, MAX_MERGED_EVENTS + 10) and held.num_events == 1
    # many small steps: the batch cap
    merged, count, held = merge_queued(_step(keys, 0, 1), _queue([_step(keys, s, 1) for s in range(1, 100)]))
    assert count == MAX_MERGED_BATCHES and held is None


def _assert_every_step_once_in_order(client, keys: Keys, num_steps: int, num_requests: int) -> None:
    for r in range(num_requests):
        events = read_events(client, keys, f"r{r}")
        assert [(seq, e.token_ids) for seq, e in events] == [(s + 1, [s]) for s in range(num_steps)]


def test_the_thread_publisher_drains_a_backlog_in_capped_writes(redis_server, prefix) -> None:
    keys, client = Keys(prefix), redis_server.client()
    written: list[tuple[int, int]] = []
    publisher = Publisher(client, keys, "w1", 60, on_lost=print, on_written=lambda n, d: written.append((n, d)))
    size = 200
    for step in range(12):  # queued before the thread starts: a backlog of 12 steps
        publisher.submit(_step(keys, step, size))
    publisher.start()
    assert publisher.close(10)
    assert [n for n, _ in written] == [2 * size] * 6  # two steps a write: a third would pass 512
    _assert_every_step_once_in_order(client, keys, 12, size)


def test_the_publisher_process_drains_a_backlog_in_capped_writes(redis_server, prefix) -> None:
    keys, client = Keys(prefix), redis_server.client()
    written: list[tuple[int, int]] = []
    publisher = PublisherProcess(redis_server.url, 5.0, prefix, "w1", 60, print, lambda n, d: written.append((n, d)))
    publisher.start()
    size = 100
    os.kill(publisher._process.pid, signal.SIGSTOP)  # the child falls behind: 12 steps wait in the pipe
    try:
        for step in range(12):
            publisher.submit(_step(keys, step, size))
    finally:
        os.kill(publisher._process.pid, signal.SIGCONT)
    assert publisher.close(10)
    assert [n for n, _ in written] == [5 * size, 5 * size, 2 * size]  # five steps a write, then the rest
    _assert_every_step_once_in_order(client, keys, 12, size)
