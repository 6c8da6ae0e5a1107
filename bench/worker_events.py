"""The worker loop's per-step event cost on the host, without Redis or a GPU: turning one step's
RequestOutputs into result events (worker.outputs.events_for_outputs) and packing + pickling them for
the publisher process (worker.publisher_process._pack, the pipe's pickler).

    python -m bench.worker_events                    # this tree
    python -m bench.worker_events --tree /tmp/old   # an earlier tree's worker/ and engine/

Each figure is the best of 5 repeats of 300 steps, in ms per step, for --outputs token outputs of one
token each (the decode steady state), and the pickled batch's size. Writes worker_events.json into $OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.report import write_json


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="checkout whose worker/ runs")
    parser.add_argument("--outputs", type=int, default=144, help="running requests (the service run's mean batch)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


def _best_ms(fn, repeats: int = 5, steps: int = 300) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        best = min(best, (time.perf_counter() - start) / steps * 1000)
    return best


def main(argv=None) -> dict:
    args = _parse_args(argv)
    sys.path.insert(0, args.tree)
    from multiprocessing.reduction import ForkingPickler

    from engine.outputs import RequestOutput
    from worker.job import Job
    from worker.outputs import events_for_outputs
    from worker.publisher import Batch
    from worker.publisher_process import _pack

    ids = [f"cmpl-{i:032x}" for i in range(args.outputs)]
    jobs = {rid: Job(rid, f"1-{i}", f"inferq:result:{rid}", f"inferq:events:{rid}", 1, 500)
            for i, rid in enumerate(ids)}  # fmt: skip
    outputs = [RequestOutput(rid, 0, [1234], " word", None, False, None, 500, 10) for rid in ids]
    made = events_for_outputs(jobs, outputs, "worker-0")[0]
    # trees before session 27 returned a list of EventWrites, later ones the step's Batch (token events in columns)
    batch = made if isinstance(made, Batch) else Batch(events=made)

    result = {
        "tree": args.tree,
        "outputs": args.outputs,
        "events_ms": _best_ms(lambda: events_for_outputs(jobs, outputs, "worker-0")),
        "pack_and_pickle_ms": _best_ms(lambda: ForkingPickler.dumps(_pack(batch))),
        "pickled_bytes": len(ForkingPickler.dumps(_pack(batch))),
    }
    write_json(args.out, "worker_events.json", result)
    return result


if __name__ == "__main__":
    main()
