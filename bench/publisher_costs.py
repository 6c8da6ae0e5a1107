"""The publisher's cost per batch of token events, by stage, against a private redis-server: what the publisher
process spends on one engine step at full batch.

    python -m bench.publisher_costs                  # 256 token events a batch, writes publisher_costs.json

Why: with token events handed over in columns (worker/token_events.py) the worker loop's own event work fell to
~0.15 ms a step, but its hand-off to the publisher process still took 0.5-0.6 ms a step on H100 hosts, the pipe's
send waiting for a child that falls behind (bench/results/h100/session27/README.md). The stages, each the mean
ms per batch over --batches batches (every batch a fresh sequence number, so every XADD writes):
- encode: XADD fields and pub/sub payload of each event, straight from the columns (`Publisher._event_writes`;
  before session 27's encoder the columns were first made EventWrites, "materialize" in the results before it);
- args: the script's argument list (`write_events_args`);
- pack: redis-py packing the EVAL into RESP;
- redis: sending it and reading the statuses back (Redis runs the XADDs, PUBLISHes and EXPIREs);
- write: `Publisher.write` of a whole batch (all of the above in one MULTI), for the total.
"""

from __future__ import annotations

import argparse
import os
import time

from bench.report import write_json


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=256, help="token events a batch (one engine step's)")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


def token_step(keys, request_ids: list[str], seq: int):
    """One full-batch step's Batch: a token event at `seq` for each request, in columns (as the worker hands them
    over). Also bench/publisher_backlog.py's steps."""
    from worker.publisher import Batch
    from worker.token_events import TokenEvents

    tokens = TokenEvents("worker-0")
    for rid in request_ids:
        tokens.request_ids.append(rid)
        tokens.streams.append(keys.result(rid))
        tokens.channels.append(keys.events(rid))
        tokens.seqs.append(seq)
        tokens.indexes.append(0)
        tokens.texts.append(" word")
        tokens.token_ids.append([1234])
        tokens.logprobs.append(None)
    return Batch(tokens=[(0, tokens)])


def measure(redis_url: str, num_events: int, num_batches: int) -> dict:
    import redis

    from worker.event_script import write_events_args
    from worker.protocol import Keys
    from worker.publisher import Publisher

    keys = Keys("bench-publisher")
    client = redis.Redis.from_url(redis_url)
    publisher = Publisher(client, keys, "worker-0", 600, lambda request_id: None)
    request_ids = [f"cmpl-{i:032x}" for i in range(num_events)]
    connection = client.connection_pool.get_connection()
    totals = dict.fromkeys(("encode", "args", "pack", "redis", "write"), 0.0)
    try:
        for step in range(num_batches):
            batch = token_step(keys, request_ids, 2 * step + 1)
            marks = [time.perf_counter()]
            writes, _ = publisher._event_writes(batch)
            marks.append(time.perf_counter())
            args = write_events_args(600, writes)
            marks.append(time.perf_counter())
            packed = connection.pack_command("EVAL", *args)
            marks.append(time.perf_counter())
            connection.send_packed_command(packed)
            connection.read_response()
            marks.append(time.perf_counter())
            for name, (a, b) in zip(("encode", "args", "pack", "redis"), zip(marks, marks[1:])):
                totals[name] += b - a
            batch = token_step(keys, request_ids, 2 * step + 2)
            start = time.perf_counter()
            publisher.write(batch)
            totals["write"] += time.perf_counter() - start
    finally:
        client.connection_pool.release(connection)
        client.delete(*[keys.result(rid) for rid in request_ids])
    return {name: seconds * 1e3 / num_batches for name, seconds in totals.items()} | {"args_per_batch": len(args)}


def main(argv=None) -> dict:
    from bench.service_processes import private_redis

    args = _parse_args(argv)
    with private_redis() as url:
        result = {"events": args.events, "batches": args.batches,
                  "ms_per_batch": measure(url, args.events, args.batches)}  # fmt: skip
    write_json(args.out, "publisher_costs.json", result)
    print(result)
    return result


if __name__ == "__main__":
    main()
