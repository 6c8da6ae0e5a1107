"""What each rank of a CPU tensor-parallel test runs (gloo), importable by spawned processes.

`model_logits_rank` builds one rank's shard of each tiny checkpoint and runs the same three paged steps as
tests/engine/test_model_parity.py (a varlen prefill of three prompts, a decode step, a mixed step), then a
greedy continuation; rank 0 writes its logits and tokens to a file the test compares with one rank's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from engine.config import ModelConfig
from engine.model_loader import load_model
from engine.parallel.group import SINGLE, TensorParallel
from tests.engine.model_harness import PagedHarness, greedy_generate

PROMPTS = {"a": list(range(5, 10)), "b": [(7 * i + 3) % 4000 + 3 for i in range(17)], "c": list(range(100, 133))}
GREEDY_TOKENS = 12


@torch.no_grad()
def model_outputs(model_dir: Path, tp: TensorParallel, quantization: str | None = None) -> dict[str, object]:
    """Every logit row of three paged steps and a greedy continuation, for one checkpoint on one rank
    (quantized at load where `quantization` names a scheme)."""
    config = ModelConfig(model=str(model_dir), quantization=quantization)
    model = load_model(config, torch.device("cpu"), torch.float32, tp=tp).model
    harness = PagedHarness(model)
    rows = [harness.step(PROMPTS)]  # varlen prefill
    rows.append(harness.step({name: [11] for name in PROMPTS}))  # decode
    rows.append(harness.step({"a": [12, 13, 14], "b": [15]}))  # mixed: a chunk beside a decode
    logits = torch.cat([t for step in rows for t in step.values()])
    tokens = greedy_generate(model, PROMPTS["c"], GREEDY_TOKENS, stop_ids=set())
    return {"logits": logits, "tokens": tokens}


def model_logits_rank(rank: int, size: int, rendezvous: str, model_dirs: list[str], out: str) -> None:
    """One rank of `size`: each checkpoint's outputs; rank 0 saves them to `out`. An entry "DIR@SCHEME" quantizes
    DIR's checkpoint at load."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=size)
    try:
        tp = TensorParallel(rank, size, dist.group.WORLD) if size > 1 else SINGLE
        results = {}
        for entry in model_dirs:
            model_dir, _, quantization = entry.partition("@")
            results[entry] = model_outputs(Path(model_dir), tp, quantization or None)
        if rank == 0:
            torch.save(results, out)
        dist.barrier()  # no rank leaves the group while another still has a collective in flight
    finally:
        dist.destroy_process_group()
    # A gloo process group whose last reference dies during interpreter finalization can abort the process
    # ("terminate called without an active exception", seen about once a CI run): the results are written, so
    # this rank ends here, before finalization.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
