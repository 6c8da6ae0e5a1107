"""bench/decode_varlen_trials.py times decode attention over one mixed-length batch in several orders; its
permuted batches must be the same batch (each row's output where the permutation puts it), or the GPU
rows would compare different work. run_case checks that against the reference for every order."""

from __future__ import annotations

import torch

from bench.decode_varlen_trials import DRY_CASES, run_case
from bench.kernel_timing import Bench


def test_every_order_of_the_mixed_batch_gives_the_reference_rows_and_the_same_keys(device):
    bench = Bench(device=device, dry_run=True, l2_bytes=0)
    rows = run_case(bench, DRY_CASES[0], torch.float32, None, block_size=16, splits_sweep=False)
    orders = ["uniform", "as scheduled", "longest first", "shortest first", "kernel order"]
    assert [r["order"] for r in rows] == orders + ["kernel mapping, random order"]
    # the same total of keys in every row (uniform: the mean length, rounded), so GB/s compare like with like
    mixed_bytes = {r["gbps"] * r["us"] for r in rows[1:]}
    assert max(mixed_bytes) - min(mixed_bytes) < 1e-6 * max(mixed_bytes)
