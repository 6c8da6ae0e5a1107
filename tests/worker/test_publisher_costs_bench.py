"""bench/publisher_costs.py against the suite's private Redis: every stage is timed and the batches' events land."""

from __future__ import annotations

from bench.publisher_costs import measure


def test_each_stage_is_timed_and_the_events_are_written_then_cleaned_up(redis_server) -> None:
    costs = measure(redis_server.url, num_events=4, num_batches=3)
    assert set(costs) == {"encode", "args", "pack", "redis", "write", "args_per_batch"}
    assert all(costs[stage] > 0 for stage in ("encode", "args", "pack", "redis", "write"))
    assert costs["args_per_batch"] == 3 + 4 * (1 + 5 + 2 * 7)  # script, numkeys, ttl; a key and 19 args an event
    assert not redis_server.client().keys("bench-publisher:result:*")  # measure() deletes what it wrote
