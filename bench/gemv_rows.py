"""The few-rows projections (kernels/gemv_rows.py) against what the engine ran before them, at 2..8 token rows and
the projection shapes of small and large models: where engine/ops.py's GEMV_ROWS_MAX_WEIGHTS should stand.

For each projection (random bf16 weights) and row count M, per call in CUDA-graph replays of calls over weight
copies that together exceed the L2 (bench/kernel_timing.py; the Triton kernels chain with PDL as in the engine):
    plain (o, down):       gemv_rows                      against F.linear (cuBLAS)
    normed (qkv, gate_up): rms_norm_gemv_rows (+ SwiGLU)  against the fused add-RMSNorm kernel, F.linear
                                                          (and the SiLU-and-mul kernel)
and the kernel's share of the weight-read floor (weight bytes / read bandwidth measured in this run). Each
kernel case also runs the TILE_SWEEP tiles; the table shows the default tile and the best one.

    python -m bench.gemv_rows [--out DIR] [--models SmolLM2-135M,...] [--rows 2,4,8] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

STEM = "gemv_rows"
ROWS = (2, 4, 8)  # the decode buckets a few rows pad to (a verification step's 5 rows to 8)
DRY_ROWS = (3,)
TILE_SWEEP = (
    {"BLOCK_N": 1, "BLOCK_K": 512, "num_warps": 4},
    {"BLOCK_N": 1, "BLOCK_K": 512, "num_warps": 8},
    {"BLOCK_N": 2, "BLOCK_K": 256, "num_warps": 8},
    {"BLOCK_N": 2, "BLOCK_K": 128, "num_warps": 4},
    {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 8},
)
EPS = 1e-5


@dataclass(frozen=True)
class Projection:
    model: str
    name: str
    num_out: int
    num_in: int
    normed: bool  # a pre-norm before it (qkv, gate_up)
    swiglu: bool = False


def projections(model: str, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int) -> list[Projection]:
    return [
        Projection(model, "qkv", (heads + 2 * kv_heads) * head_dim, hidden, True),
        Projection(model, "o", hidden, heads * head_dim, False),
        Projection(model, "gate_up", 2 * inter, hidden, True, swiglu=hidden <= 2048),
        Projection(model, "down", hidden, inter, False),
    ]


SHAPES = {
    "SmolLM2-135M": projections("SmolLM2-135M", 576, 9, 3, 64, 1536),
    "Qwen2.5-0.5B": projections("Qwen2.5-0.5B", 896, 14, 2, 64, 4864),
    "Llama-3.2-1B": projections("Llama-3.2-1B", 2048, 32, 8, 64, 8192),
    "Llama-3.1-8B": projections("Llama-3.1-8B", 4096, 32, 8, 128, 14336),
}
DRY_SHAPES = projections("tiny", 128, 4, 2, 32, 256)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    parser.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    parser.add_argument("--rows", default="", help="comma-separated row counts (default: 2,4,8)")
    return parser.parse_args(argv)


def _calls(proj: Projection):
    """(kernel(x, res, g, w, tiles), baseline(x, res, g, w)) of one projection."""
    from engine import ops
    from kernels.gemv_rows import gemv_rows, rms_norm_gemv_rows

    if not proj.normed:
        return (lambda x, res, g, w, tiles: gemv_rows(x, w, tiles=tiles)), (lambda x, res, g, w: F.linear(x, w))

    def kernel(x, res, g, w, tiles):
        return rms_norm_gemv_rows(x, res, g, EPS, w, swiglu=proj.swiglu, tiles=tiles)

    def baseline(x, res, g, w):
        with ops.kernel_backend("triton"):
            normed, _ = ops.fused_add_rms_norm(x, res, g, EPS)
            y = F.linear(normed, w)
            return ops.silu_and_mul(y) if proj.swiglu else y

    return kernel, baseline


def measure_projection(bench, proj: Projection, rows: tuple[int, ...], read_gbps: float) -> list[dict]:
    dtype = torch.bfloat16 if bench.device.type == "cuda" else torch.float32
    weight = (torch.randn(proj.num_out, proj.num_in, device=bench.device) * proj.num_in**-0.5).to(dtype)
    nbytes = weight.numel() * weight.element_size()
    copies = [weight] + [weight.clone() for _ in range(bench.rotations(nbytes) - 1)]
    g = (1 + 0.1 * torch.randn(proj.num_in, device=bench.device)).to(dtype)
    kernel, baseline = _calls(proj)
    floor_us = nbytes / read_gbps / 1e3
    out = []
    for m in rows:
        x = torch.randn(m, proj.num_in, device=bench.device).to(dtype)
        res = torch.randn(m, proj.num_in, device=bench.device).to(dtype)
        inputs = [(x, res, g, w) for w in copies]
        print(f"{proj.model} {proj.name} {m} rows", flush=True)
        base_ms, how = bench.measure(baseline, inputs, True)
        sweep = TILE_SWEEP[:1] if bench.dry_run else TILE_SWEEP  # a dry run checks the code paths only
        tiles = {"default": None} | {str(t): t for t in sweep}
        kernel_us = {}
        for label, tile in tiles.items():
            ms, _ = bench.measure(lambda x, res, g, w, tile=tile: kernel(x, res, g, w, tile), inputs, True)
            kernel_us[label] = ms * 1e3
        best = min(kernel_us, key=kernel_us.get)
        out.append({"model": proj.model, "proj": proj.name, "N": proj.num_out, "K": proj.num_in, "rows": m,
                    "normed": proj.normed, "swiglu": proj.swiglu, "weight_elements": weight.numel(),
                    "floor_us": floor_us, "baseline_us": base_ms * 1e3, "kernel_us": kernel_us["default"],
                    "best_tile": best, "best_us": kernel_us[best], "tiles_us": kernel_us, "timing": how})  # fmt: skip
    del copies, weight
    bench.free()
    return out


def markdown(results: dict) -> str:
    env, ceil = results["environment"], results["ceilings"]
    lines = [f"# Few-rows projections ({env.get('gpu', '?')}, read {ceil['read_gbps']:.0f} GB/s measured in this run)",
             "", f"{env.get('date', '')} · torch {env.get('torch', '?')} · triton {env.get('triton', '?')}", "",
             "us per call in CUDA-graph replays. before: F.linear (qkv, gate_up: after the fused add-RMSNorm kernel, "
             "gate_up at hidden <= 2048 also the SiLU-and-mul kernel). kernel: kernels/gemv_rows.py at its default "
             "tile (with the norm and SwiGLU where 'before' has them). x before = before / kernel (> 1: the kernel "
             "is faster). of floor: weight bytes / read bandwidth over the kernel's time.", "",
             "| model | proj | N x K | rows | before us | kernel us | x before | of floor | best tile | best us |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["rows"]:
        lines.append(
            f"| {r['model']} | {r['proj']} | {r['N']} x {r['K']} | {r['rows']} | {r['baseline_us']:.1f} | "
            f"{r['kernel_us']:.1f} | {r['baseline_us'] / r['kernel_us']:.2f} | {r['floor_us'] / r['kernel_us']:.0%} | "
            f"{r['best_tile']} | {r['best_us']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = _parse_args(argv)
    from bench.engine_common import environment, write_results
    from bench.kernel_timing import Bench, measure_ceilings

    bench = Bench.for_run(args.dry_run)
    if args.dry_run:
        shapes = DRY_SHAPES
    else:
        wanted = [m for m in args.models.split(",") if m]
        if set(wanted) - set(SHAPES):
            raise SystemExit(f"--models: unknown {sorted(set(wanted) - set(SHAPES))}; known: {sorted(SHAPES)}")
        shapes = [p for m in wanted for p in SHAPES[m]]
    rows = tuple(int(r) for r in args.rows.split(",")) if args.rows else (DRY_ROWS if args.dry_run else ROWS)
    ceilings = measure_ceilings(bench)
    results = {"environment": environment(bench.device), "ceilings": ceilings,
               "shapes": [asdict(p) for p in shapes], "rows": []}  # fmt: skip
    out = Path(args.out)
    for proj in shapes:
        results["rows"] += measure_projection(bench, proj, rows, ceilings["read_gbps"])
        write_results(out, STEM, results, markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
