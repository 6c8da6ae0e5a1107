"""Tile alternatives of the quantized GEMM (kernels/quant_gemm.py) around its defaults, at one token and the
streaming token counts, where the defaults are reasoned rather than measured (decision
0055-quantized-gemm-kernels): which BLOCK_N / BLOCK_K / warps / stages read the weights fastest.

For each case (projection, format, tokens) every candidate tile is timed as bench/quant_gemm.py times (CUDA
graph replays over weight copies that exceed the L2) and reported against the default tile and the bytes
floor. Results: quant_tiles.{json,md} in --out.

    python -m bench.quant_tiles [--out DIR] [--formats int4,fp8_block,...] [--tokens 1,16,64] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from bench.quant_gemm import DRY_SHAPES, SHAPES, matmul_for, weight_bytes, weight_for

STEM = "quant_tiles"
FORMATS = ("int4", "nf4", "fp8_block", "bf16")
TOKENS = (1, 16, 64)
FORMAT_IDS = {"bf16": 0, "int8": 1, "int4": 2, "nf4": 3, "fp8_block": 4, "fp8_channel": 4}


def candidates(fmt: str, num_tokens: int, on_gpu: bool, num_out: int = 0, num_in: int = 0) -> list[dict]:
    """The launcher's tile for the shape first, then the alternatives: at one token a grid, at more tokens one
    change at a time (and two pairs)."""
    from kernels.quant_gemm import default_tiles
    from kernels.quant_gemv import gemv_tiles

    if num_tokens == 1:  # kernels/quant_gemv.py
        base = gemv_tiles(FORMAT_IDS[fmt], on_gpu, num_out, num_in, per_channel=fmt == "fp8_channel")
        # a grid: rows a program (x's re-reads from L2 fall as they grow), the step, and warps
        chunks = (1024, 2048, 4096) if fmt in ("int4", "nf4") else (512, 1024, 2048)
        rows, warps = ((2, 4, 8, 16), (4, 8)) if on_gpu else ((2, 4, 8), (1,))
        changes = [{"BLOCK_N": n, "CHUNK": c if on_gpu else c // 16, "num_warps": w}
                   for n in rows for c in chunks for w in warps]  # fmt: skip
    else:
        base = default_tiles(FORMAT_IDS[fmt], num_tokens, fmt == "fp8_block", on_gpu)
        k_fixed = fmt == "fp8_block"  # the fp8 dot's chunk is its scales' 128 columns
        changes = [{"BLOCK_N": 32}, {"BLOCK_N": 64}, {"num_warps": 12 - base["num_warps"]}, {"num_stages": 2},
                   {"num_stages": 4}, {"BLOCK_N": 32, "num_warps": 8}]  # fmt: skip
        if not k_fixed:
            changes += [{"BLOCK_K": base["BLOCK_K"] // 2}, {"BLOCK_K": base["BLOCK_K"] * 2}]
    tiles = [base] + [{**base, **c} for c in changes]
    unique = []
    for tile in tiles:
        if tile not in unique and tile.get("BLOCK_K", tile.get("CHUNK")) >= 64:
            unique.append(tile)
    return unique


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--tokens", default=",".join(str(t) for t in TOKENS))
    parser.add_argument("--shapes", default="Llama-3.1-8B qkv,Llama-3.2-1B o", help="comma-separated model proj")
    return parser.parse_args(argv)


def measure_case(bench, proj, fmt: str, num_tokens: int, ceilings: dict) -> list[dict]:
    weight = weight_for(fmt, proj, bench.device)
    nbytes_w = weight_bytes(weight)
    copies = [weight] + [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in weight.items()}
                         for _ in range(bench.rotations(nbytes_w) - 1)]  # fmt: skip
    dtype = torch.bfloat16 if bench.device.type == "cuda" else torch.float32
    x = torch.randn(num_tokens, proj.num_in, device=bench.device).to(dtype)
    floor_us = (nbytes_w + num_tokens * (proj.num_in + proj.num_out) * x.element_size()) / ceilings["read_gbps"] / 1e3
    matmul = matmul_for(fmt)
    rows = []
    for tile in candidates(fmt, num_tokens, bench.device.type == "cuda", proj.num_out, proj.num_in):
        row = {"model": proj.model, "proj": proj.name, "format": fmt, "tokens": num_tokens, "tile": tile,
               "floor_us": floor_us}  # fmt: skip
        try:
            ms, _ = bench.measure(lambda x, w, tile=tile: matmul(x, **w, tiles=tile), [(x, w) for w in copies], True)
            row.update(us=ms * 1e3, frac_of_floor=floor_us / (ms * 1e3))
        except Exception as e:  # a tile the GPU cannot hold (shared memory, registers): reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        rows.append(row)
    del copies, weight
    bench.free()
    return rows


def tile_name(tile: dict) -> str:
    """BLOCK_N, BLOCK_K (one token: CHUNK), warps and stages in a few characters (BLOCK_M follows the token
    count)."""
    stages = f" s{tile['num_stages']}" if "num_stages" in tile else ""
    return f"N{tile['BLOCK_N']} K{tile.get('BLOCK_K', tile.get('CHUNK'))} w{tile['num_warps']}{stages}"


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [f"# Quantized GEMM tiles ({env.get('gpu', '?')})", "",
             "First tile of each case: the launcher's default. us (share of the bytes floor).", "",
             "| case | default us | best us | best tile | default tile |", "|---|---|---|---|---|"]  # fmt: skip
    cases: dict = {}
    for r in results["rows"]:
        cases.setdefault((r["model"], r["proj"], r["format"], r["tokens"]), []).append(r)
    for (model, proj, fmt, tokens), rows in cases.items():
        ok = [r for r in rows if "us" in r]
        if not ok:
            continue
        default, best = rows[0], min(ok, key=lambda r: r["us"])
        default_us = f"{default['us']:.1f} ({default['frac_of_floor']:.0%})" if "us" in default else default["error"]
        best_us = f"{best['us']:.1f} ({best['frac_of_floor']:.0%})"
        lines.append(f"| {model} {proj} {fmt} M={tokens} | {default_us} | {best_us} | {tile_name(best['tile'])} | "
                     f"{tile_name(default['tile'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = _parse_args(argv)
    from bench.engine_common import environment, write_results
    from bench.kernel_timing import Bench, measure_ceilings

    bench = Bench.for_run(args.dry_run)
    device = bench.device
    known = {f"{p.model} {p.name}": p for shapes in (DRY_SHAPES if args.dry_run else SHAPES).values() for p in shapes}
    wanted = list(known) if args.dry_run else [s for s in args.shapes.split(",") if s]
    if set(wanted) - set(known):
        raise SystemExit(f"--shapes: unknown {sorted(set(wanted) - set(known))}; known: {sorted(known)}")
    formats = [f for f in args.formats.split(",") if f]
    if set(formats) - set(FORMAT_IDS):
        raise SystemExit(f"--formats: unknown {sorted(set(formats) - set(FORMAT_IDS))}; known: {sorted(FORMAT_IDS)}")
    tokens = [int(t) for t in args.tokens.split(",") if t]
    results = {"environment": environment(device), "ceilings": measure_ceilings(bench), "rows": []}
    out = Path(args.out)
    for name in wanted[:1] if args.dry_run else wanted:
        for fmt in formats:
            for num_tokens in tokens:
                results["rows"] += measure_case(bench, known[name], fmt, num_tokens, results["ceilings"])
                write_results(out, STEM, results, markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
