"""What an all-reduce costs between N GPUs of one host: the collective a tensor-parallel decode step waits
on 2 L + 1 times (after each layer's attention output and down projection, and after the vocabulary-parallel
embedding; docs/tensor-parallelism.md).

Legend: N = ranks, B = rows (tokens of a step), H = hidden size.

N processes are spawned (rank r on cuda:r, NCCL; gloo on the CPU in a dry run), apart from the engine: the
caller runs this before it builds any engine, and the processes have ended when it returns. Each times
`dist.all_reduce` (sum, in place) of bf16 [B, H] messages, the decode step's (B = 1) and a batch's (B = 64),
for each H asked for, and of one large buffer, the bus-bandwidth test: busbw = 2 (N - 1) / N * bytes / time,
the rate of each GPU's links that a ring all-reduce of that time implies (NCCL's tests report the same).

Timing: CUDA events around `INNER` all-reduces launched back to back, the median over `REPEATS` such runs after
warm-up, over the slowest rank. Small messages are timed twice: launched from Python (eager) and replayed
from a CUDA graph of the same `INNER` all-reduces, as the engine's graphed decode steps run them; the graph's
figure is the one a decode step pays. Each run starts from random values (copied in outside the timed span):
summing in place multiplies them by N a call.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SMALL_ROWS = (1, 64)
BUS_BYTES = 256 * 2**20
WARMUP, REPEATS, INNER = 20, 50, 20  # small messages
BUS_WARMUP, BUS_REPEATS = 3, 20  # the large buffer, one all-reduce a run
DRY_BUS_BYTES = 2**20  # a dry run's "large" buffer on gloo (code paths only)
TIMEOUT_S = 300


def measure_all_reduce(size: int, hidden_sizes: list[int], dry_run: bool) -> dict:
    """All-reduce costs over `size` ranks, measured in processes of their own (ended on return).

    Args:
        size: N (> 1).
        hidden_sizes: the H of each model to be benchmarked ([1, H] and [64, H] messages for each).
        dry_run: gloo on the CPU, few iterations, a 1 MiB buffer: code paths only.

    Returns:
        {"size", "backend", "dtype", "messages": [{rows, hidden, bytes, us_eager, us_graph, ...}],
         "bus": {bytes, us, algbw_gbps, busbw_gbps}, "nccl_nvls_enable"}.
    """
    rendezvous = tempfile.mkdtemp(prefix="inferq-allreduce-")
    out_path = Path(rendezvous) / "result.json"
    try:
        mp.spawn(_rank_main, args=(size, f"file://{rendezvous}/rendezvous", sorted(set(hidden_sizes)), dry_run,
                                   str(out_path)), nprocs=size, join=True)  # fmt: skip
        return json.loads(out_path.read_text())
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


def _rank_main(rank: int, size: int, init_method: str, hidden_sizes: list[int], dry_run: bool, out: str) -> None:
    backend = "gloo" if dry_run else "nccl"
    device = torch.device("cpu") if dry_run else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=timedelta(seconds=TIMEOUT_S))  # fmt: skip
    try:
        result = _measure(rank, size, device, hidden_sizes, dry_run)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _measure(rank: int, size: int, device: torch.device, hidden_sizes: list[int], dry_run: bool) -> dict:
    warmup, repeats, inner = (2, 5, 4) if dry_run else (WARMUP, REPEATS, INNER)
    generator = torch.Generator(device=device).manual_seed(rank)
    messages = []
    for hidden in hidden_sizes:
        for rows in SMALL_ROWS:
            source = torch.randn(rows, hidden, generator=generator, device=device).to(torch.bfloat16)  # [B, H]
            row = {"rows": rows, "hidden": hidden, "bytes": source.numel() * source.element_size()}
            row["us_eager"] = _slowest(_eager_us(source, warmup, repeats, inner), device)
            if device.type == "cuda":
                row["us_graph"] = _slowest(_graph_us(source, warmup, repeats, inner), device)
            messages.append(row)
    nbytes = DRY_BUS_BYTES if dry_run else BUS_BYTES
    source = torch.randn(nbytes // 2, generator=generator, device=device).to(torch.bfloat16)
    bus_warmup, bus_repeats = (1, 3) if dry_run else (BUS_WARMUP, BUS_REPEATS)
    bus_us = _slowest(_eager_us(source, bus_warmup, bus_repeats, 1), device)
    algbw = nbytes / (bus_us * 1e-6) / 1e9
    return {
        "size": size,
        "backend": dist.get_backend(),
        "dtype": "bfloat16",
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
        "messages": messages,
        "bus": {"bytes": nbytes, "us": bus_us, "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (size - 1) / size},
        "iterations": {"warmup": warmup, "repeats": repeats, "inner": inner, "bus_repeats": bus_repeats},
    }


def _eager_us(source: torch.Tensor, warmup: int, repeats: int, inner: int) -> float:
    """Median µs of one all-reduce launched from Python, `inner` back to back a run."""
    x = source.clone()
    for _ in range(warmup):
        dist.all_reduce(x)
    return _median_us(lambda: [dist.all_reduce(x) for _ in range(inner)], x, source, repeats, inner)


def _graph_us(source: torch.Tensor, warmup: int, repeats: int, inner: int) -> float:
    """Median µs of one all-reduce replayed from a CUDA graph of `inner` of them (every rank captures it)."""
    x = source.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # NCCL's communicator and buffers exist before the capture
        for _ in range(warmup):
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local, as the engine captures (engine/cuda_graphs.py): NCCL's watchdog thread queries events meanwhile
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(inner):
            dist.all_reduce(x)
    graph.replay()
    return _median_us(graph.replay, x, source, repeats, inner)


def _median_us(run, x: torch.Tensor, source: torch.Tensor, repeats: int, inner: int) -> float:  # noqa: ANN001
    """Median over `repeats` runs of `run` (inner all-reduces of x) of µs per all-reduce; x reset before each."""
    times = []
    for _ in range(repeats):
        x.copy_(source)
        # every rank starts the run together: the first call does not time a peer's lateness
        dist.barrier(device_ids=[x.device.index]) if x.is_cuda else dist.barrier()
        if x.is_cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / inner)
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e6 / inner)
    return statistics.median(times)


def _slowest(us: float, device: torch.device) -> float:
    """The largest of every rank's figure: a step waits for the slowest rank."""
    t = torch.tensor([us], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def decode_step_share(result: dict, hidden: int, num_layers: int, ms_per_token: float) -> dict | None:
    """The all-reduces of one batch-1 decode step, (2 L + 1) * t([1, H]), and their share of a token's time;
    t from the graph replay where there is one (the engine replays its decode steps), else the eager figure."""
    for row in result["messages"]:
        if row["rows"] == 1 and row["hidden"] == hidden:
            us = row.get("us_graph") or row["us_eager"]
            per_step_ms = (2 * num_layers + 1) * us / 1e3
            return {"all_reduces": 2 * num_layers + 1, "us_each": us, "ms_per_step": per_step_ms,
                    "share_of_ms_per_token": per_step_ms / ms_per_token}  # fmt: skip
    return None
