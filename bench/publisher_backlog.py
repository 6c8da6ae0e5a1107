"""How long Redis answers no one else while a publisher that fell behind drains its backlog, by merge cap.

    python -m bench.publisher_backlog          # 16 queued steps of 256 token events, caps 512 and unbounded

Why: a publisher behind by k steps merges them into one write (worker.publisher.merge_queued), and Redis runs a
write's script to the end before it serves any other client. Session 31's service runs saw the worker loop's
step reads wait 6-50 ms a few times a run for a Redis that answered nothing (bench/results/h100/session31/).
This runs the real publisher (the thread kind: the same merge and the same write as the process kind) against a
private redis-server with a backlog queued before it starts, while a probe process sends a GET every ~0.2 ms and
records each round trip. Per cap (MAX_MERGED_EVENTS for this run): the drain's wall time, the writes it took,
and the probe's longest and 99th-percentile round trip during the drain (ms; medians over --rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import table, write_json

UNBOUNDED = 10**9


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16, help="steps queued before the publisher starts")
    parser.add_argument("--events", type=int, default=256, help="token events a step (a full batch's)")
    parser.add_argument("--caps", default=f"512,{UNBOUNDED}", help="MAX_MERGED_EVENTS values to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--probe", nargs=2, metavar=("REDIS_URL", "STOP_FILE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _probe(redis_url: str, stop_file: str) -> None:
    """The probe process: GET round trips until stop_file exists; prints [(start, ms), ...] as JSON."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.ping()
    samples = []
    print("ready", flush=True)
    while not os.path.exists(stop_file):
        start = time.perf_counter()
        client.get("probe")
        samples.append((start, (time.perf_counter() - start) * 1e3))
        time.sleep(0.0002)
    print(json.dumps(samples), flush=True)


def drain(redis_url: str, cap: int, num_steps: int, num_events: int, round_index: int) -> dict:
    """One backlog of num_steps steps drained by a publisher merging up to `cap` events, with the probe."""
    import redis

    from bench.publisher_costs import token_step
    from worker import publisher as publisher_module
    from worker.protocol import Keys

    keys = Keys(f"bench-backlog-{round_index}")
    request_ids = [f"cmpl-{i:032x}" for i in range(num_events)]
    client = redis.Redis.from_url(redis_url)
    written: list[int] = []
    publisher = publisher_module.Publisher(client, keys, "worker-0", 600, lambda rid: None,
                                           on_written=lambda n, d: written.append(n))  # fmt: skip
    for step in range(num_steps):
        publisher.submit(token_step(keys, request_ids, step + 1))
    stop_file = Path(tempfile.mkdtemp()) / "stop"
    probe = subprocess.Popen([sys.executable, "-m", "bench.publisher_backlog", "--probe", redis_url, str(stop_file)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    saved, publisher_module.MAX_MERGED_EVENTS = publisher_module.MAX_MERGED_EVENTS, cap
    try:
        if probe.stdout.readline().strip() != "ready":
            raise RuntimeError("the probe process did not start")
        time.sleep(0.05)  # the probe's first round trips: an idle Redis
        started = time.perf_counter()
        publisher.start()
        if not publisher.close(60):
            raise RuntimeError("the backlog did not drain in 60 s")
        ended = time.perf_counter()
        time.sleep(0.02)
    finally:
        publisher_module.MAX_MERGED_EVENTS = saved
        stop_file.touch()
        samples = json.loads(probe.stdout.readline())
        probe.wait()
        client.delete(*[keys.result(rid) for rid in request_ids])
    # NOTE: both processes read CLOCK_MONOTONIC (perf_counter), so the probe's starts fall on this clock
    during = sorted(ms for start, ms in samples if started <= start <= ended)
    if not during:
        raise RuntimeError("the probe sent nothing while the backlog drained")
    return {
        "drain_ms": (ended - started) * 1e3,
        "writes": len(written),
        "events_written": sum(written),
        "probe_max_ms": during[-1],
        "probe_p99_ms": during[min(len(during) - 1, (99 * len(during)) // 100)],
        "probe_round_trips": len(during),
    }


def measure(redis_url: str, caps: list[int], num_steps: int, num_events: int, rounds: int) -> list[dict]:
    """Per cap, the medians over rounds (the caps alternate within a round)."""
    runs: dict[int, list[dict]] = {cap: [] for cap in caps}
    for r in range(rounds):
        for cap in caps:
            runs[cap].append(drain(redis_url, cap, num_steps, num_events, r))
    rows = []
    for cap, results in runs.items():

        def median(name: str, results: list[dict] = results) -> float:
            return sorted(x[name] for x in results)[len(results) // 2]

        rows.append({"cap": "unbounded" if cap >= UNBOUNDED else str(cap), "drain_ms": median("drain_ms"),
                     "writes": median("writes"), "probe_max_ms": median("probe_max_ms"),
                     "probe_p99_ms": median("probe_p99_ms"), "runs": results})  # fmt: skip
    return rows


def main(argv=None) -> list[dict] | None:
    args = _parse_args(argv)
    if args.probe:
        _probe(*args.probe)
        return None
    import torch

    from bench.engine_common import environment
    from bench.service_processes import private_redis

    caps = [int(c) for c in args.caps.split(",")]
    with private_redis() as url:
        rows = measure(url, caps, args.steps, args.events, args.rounds)
    meta = environment(torch.device("cpu"))
    result = {"meta": meta, "steps": args.steps, "events": args.events, "rounds": args.rounds, "rows": rows}
    write_json(args.out, "publisher_backlog.json", result)
    columns = [("cap", "merge cap (events)", ""), ("writes", "writes", ".0f"), ("drain_ms", "drain ms", ".1f"),
               ("probe_max_ms", "probe's longest GET ms", ".2f"), ("probe_p99_ms", "probe p99 ms", ".2f")]  # fmt: skip
    print(table(rows, columns))
    return rows


if __name__ == "__main__":
    main()
