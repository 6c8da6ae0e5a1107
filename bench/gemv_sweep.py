"""The sweep that chose kernels/gemv.py's tiles: a one-token GEMV over (BLOCK_N, BLOCK_K, SPLIT_K,
warps, stages) against F.linear (cuBLAS) at the Llama-3.1-8B and 3.2-1B projection shapes, as a
fraction of the read bandwidth measured in the same run (a large sum). Each candidate is timed as
a CUDA graph of 20 calls, the weights rotated through copies larger than the L2.

    python -m bench.gemv_sweep        # on a CUDA GPU; writes gemv_sweep.json into $OUT

Session 6 on an H100 (bench/results/h100/gemv_sweep_session6.json): BLOCK_N 4, BLOCK_K 512, no
split, 8 warps won or tied every shape; a split K needs a zeroed fp32 output (one more kernel)
and did not win.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SHAPES = {  # name: (N out, K in)
    "8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (28672, 4096), "8B down": (4096, 14336),
    "8B lm_head": (128256, 4096), "1B qkv": (3072, 2048), "1B o": (2048, 2048), "1B gate_up": (16384, 2048),
    "1B down": (2048, 8192), "1B lm_head": (128256, 2048),
}  # fmt: skip
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
CONFIGS = list(itertools.product((4, 8, 16), (256, 512), (1, 2), (4, 8), (3, 4)))
L2_BYTES = 200e6  # rotate through more weight than this, so that no call reads from the L2


@triton.jit
def _split_gemv(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT_K: tl.constexpr):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_per_split = tl.cdiv(K, SPLIT_K)
    k_start = tl.program_id(1) * k_per_split
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = (k < K) & (k < k_start + k_per_split)
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=(n[:, None] < N) & k_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n < N)
    else:
        tl.atomic_add(y_ptr + n, y, mask=n < N, sem="relaxed")


def _gemv(x: torch.Tensor, w: torch.Tensor, config: tuple) -> torch.Tensor:
    block_n, block_k, split_k, warps, stages = config
    num_out, num_in = w.shape
    if split_k == 1:
        y = torch.empty(num_out, device=x.device, dtype=x.dtype)
    else:
        y = torch.zeros(num_out, device=x.device, dtype=torch.float32)  # the zeroing is part of its cost
    _split_gemv[(triton.cdiv(num_out, block_n), split_k)](
        x, w, y, num_out, num_in, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return y


def _graph_us(fn: Callable[[], object], calls: int = 20, repeats: int = 15) -> float:
    """Median GPU time of one call, from CUDA-graph replays of `calls` calls."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls * 1000)
    return sorted(times)[len(times) // 2]


def trial_arguments(doc: str, argv=None) -> argparse.Namespace:
    """The command line of a trials script: --out DIR (default bench/results/tmp) and --dry-run."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes, correctness only")
    return parser.parse_args(argv)


def trial_device(dry_run: bool) -> tuple[torch.device, float | None, str]:
    """(device, read bandwidth GB/s, the results' header line) of a trials script: the CPU interpreter for
    a dry run (no timings), else the GPU with its read bandwidth measured now, by a 2 GB sum."""
    if dry_run:
        return torch.device("cpu"), None, "dry run (CPU interpreter, fp32, no timings)"
    device = torch.device("cuda")
    big = torch.empty(1024**3, dtype=torch.bfloat16, device=device).normal_()
    read_bw = big.numel() * 2 / (_graph_us(big.sum) * 1e-6) / 1e9
    del big
    meta = (f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__} · "
            f"read bandwidth {read_bw:.0f} GB/s (a 2 GB sum, same run)")  # fmt: skip
    return device, read_bw, meta


def write_trials(out: Path, stem: str, result: dict, markdown: str) -> dict:
    """OUT/STEM.json and OUT/STEM.md of a trials script; returns the result."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown)
    return result


def _rotating(weights: list[torch.Tensor], call: Callable[[torch.Tensor], object]) -> Callable[[], object]:
    state = {"i": 0}

    def fn() -> object:
        state["i"] = (state["i"] + 1) % len(weights)
        return call(weights[state["i"]])

    return fn


def _sweep_shape(num_out: int, num_in: int, read_bw: float) -> dict:
    copies = max(2, int(L2_BYTES // (num_out * num_in * 2)) + 1)
    weights = [torch.randn(num_out, num_in, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(num_in, device="cuda", dtype=torch.bfloat16)
    torch_us = _graph_us(_rotating(weights, lambda w: F.linear(x[None], w)))
    reference = F.linear(x[None].float(), weights[0].float())[0]
    best: tuple[float, tuple] | None = None
    for config in CONFIGS:
        try:
            error = (_gemv(x, weights[0], config).float() - reference).abs().max().item()
            if error > 0.05 * reference.abs().max().item():
                continue
            us = _graph_us(_rotating(weights, lambda w, config=config: _gemv(x, w, config)))
        except Exception:  # a tile that does not compile or fit is not a candidate
            continue
        if best is None or us < best[0]:
            best = (us, config)
    gigabytes = num_out * num_in * 2 / 1e9
    frac = lambda us: gigabytes / (us * 1e-6) / read_bw  # noqa: E731
    return {"N": num_out, "K": num_in, "torch_us": torch_us, "torch_frac": frac(torch_us),
            "gemv_us": best[0], "gemv_config": best[1], "gemv_frac": frac(best[0])}  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    big = torch.empty(1024**3, dtype=torch.bfloat16, device="cuda").normal_()
    read_bw = big.numel() * 2 / (_graph_us(big.sum) * 1e-6) / 1e9
    del big
    print(f"read bandwidth {read_bw:.0f} GB/s", flush=True)
    result: dict = {"read_bw_gbs": read_bw, "configs": "(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)"}
    for name, (num_out, num_in) in SHAPES.items():
        row = result[name] = _sweep_shape(num_out, num_in, read_bw)
        print(f"{name:12s} torch {row['torch_us']:7.1f} us {row['torch_frac']:.1%}   "
              f"gemv {row['gemv_us']:7.1f} us {row['gemv_frac']:.1%} {row['gemv_config']}", flush=True)  # fmt: skip
    out = Path(os.environ.get("OUT", "bench/results/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemv_sweep.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
