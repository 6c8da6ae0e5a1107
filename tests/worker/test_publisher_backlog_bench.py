"""bench/publisher_backlog.py against the suite's private Redis: the backlog drains in the writes its cap allows,
every event lands, and the probe measured Redis while it drained."""

from __future__ import annotations

from bench.publisher_backlog import UNBOUNDED, measure


def test_a_capped_drain_takes_more_writes_and_both_write_every_event(redis_server) -> None:
    capped, unbounded = measure(redis_server.url, [512, UNBOUNDED], num_steps=4, num_events=200, rounds=1)
    assert (capped["cap"], unbounded["cap"]) == ("512", "unbounded")
    assert capped["writes"] == 2 and unbounded["writes"] == 1  # 400 events a write under the cap, else all 800
    for row in (capped, unbounded):
        (run,) = row["runs"]
        assert run["events_written"] == 800 and run["probe_round_trips"] > 0
        assert 0 < row["probe_p99_ms"] <= row["probe_max_ms"] and row["drain_ms"] > 0
    assert not redis_server.client().keys("bench-backlog-*")  # the streams it wrote are gone
