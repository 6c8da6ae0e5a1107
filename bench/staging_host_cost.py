"""Host time of staging a decode step and of handing its tokens back, in whichever tree is on PYTHONPATH:
`python -m bench.staging_host_cost --out DIR` (GPU).

Why: session 22 moved a step's staging from two copies, a gather and a table copy to one Triton kernel
(kernels/stage_batch.py) and the tokens' copy back to another (kernels/write_to_host.py). A Triton launch
costs more host time than a copy; the GPU gained ~10 us a step at batch 1, and this measures what the host
pays for it, at batch 1 and 256, with every row's token pending (async scheduling's steady state) and a
block-table row changed every step. Run it once per tree (PYTHONPATH) in one call for the comparison.

Per batch: the median over CALLS of InputBatch.prepare's host time (the GPU kept busy in front of it, so
nothing waits), and of handing [2, B] tokens to a pinned buffer (the tree's way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine.input_batch import InputBatch
from engine.launched_step import SampledTokens
from engine.scheduler import ScheduledRequest

CALLS = 300
BATCHES = (1, 256)


class _Request:
    def __init__(self, request_id: str, tokens: list[int]) -> None:
        self.request_id = request_id
        self.all_token_ids = tokens


def _prepare_us(batch: int) -> float:
    device = torch.device("cuda")
    inputs = InputBatch(max_num_tokens=8192, max_num_seqs=256, max_blocks_per_seq=64, block_size=64, device=device)
    requests = [_Request(f"r{i}", list(range(200))) for i in range(batch)]  # position 200: block 3
    tables = [list(range(i * 8, i * 8 + 6)) for i in range(batch)]
    pending = SampledTokens(torch.arange(batch, device=device), list(requests))
    times = []
    for call in range(CALLS):
        tables[call % batch].append(10_000 + call)  # one row changes a step
        items = [ScheduledRequest(r, 1, len(r.all_token_ids), t, True) for r, t in zip(requests, tables, strict=True)]
        torch.cuda._sleep(2_000_000)  # the GPU busy in front, so the staging never waits for it
        start = time.perf_counter()
        inputs.prepare(items, batch, pad_to=(batch, batch), pending=pending)
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        tables[call % batch].pop()
    return statistics.median(times) * 1e6


def _tokens_back_us(batch: int) -> float:
    packed = torch.zeros(2, batch, dtype=torch.int64, device="cuda")
    host = torch.zeros(2, batch, dtype=torch.int64).pin_memory()
    try:
        from engine.ops import write_to_host

        hand_back = lambda: write_to_host(packed, host)  # noqa: E731
    except ImportError:  # a tree before session 22: a non-blocking copy
        hand_back = lambda: host.copy_(packed, non_blocking=True)  # noqa: E731
    hand_back()
    times = []
    for _ in range(CALLS):
        torch.cuda._sleep(200_000)
        start = time.perf_counter()
        hand_back()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="tree")
    args = parser.parse_args()
    rows = {b: {"prepare_us": _prepare_us(b), "tokens_back_us": _tokens_back_us(b)} for b in BATCHES}
    lines = [f"| {args.label} | {b} | {r['prepare_us']:.1f} | {r['tokens_back_us']:.1f} |" for b, r in rows.items()]
    print("| tree | batch | prepare host us | tokens back host us |\n|---|---|---|---|\n" + "\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"staging_host_cost_{args.label}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
