"""Prefill attention variants against the kernel's defaults and SDPA, in one run:
`python -m bench.prefill_trials --out DIR` (GPU) or `--dry-run` (CPU interpreter, tiny shapes).

Each trial is a pool block size and a dict of paged_prefill_attention's `tiles` (tile sizes,
warps, stages, USE_TMA); every row's output is checked against the pointer kernel's default tile
on the same pool. Session 13's trials (lazy rescaling, a register cap, Triton's Hopper warp
specialization, TMA boxes of 16-token blocks) and their results are in
bench/results/h100/prefill_trials_session13/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.engine_common import kernel_bench_device

SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
# NOTE: USE_TMA is set in every trial: left out, it defaults to True wherever the pool allows a box
SHORT = dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=4, USE_TMA=False)  # pointer gathers, queries below 4k
LONG = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, USE_TMA=False)  # and from 4k
TMA = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True)  # the default for blocks of 64
# (pool block size, tiles): the load paths at the block sizes that allow them
TRIALS = [(16, SHORT), (16, LONG), (64, SHORT), (64, dict(SHORT, USE_TMA=True)), (64, TMA),
          (64, dict(TMA, num_stages=2)), (64, dict(TMA, num_stages=4)), (128, TMA),
          (128, dict(LONG, USE_TMA=True))]  # fmt: skip


def _markdown(results: dict) -> str:
    head = results["meta"]
    lines = [f"# Prefill attention trials\n\n{head}\n", "| S | tiles | TFLOP/s | max diff |", "|---|---|---|---|"]
    for row in results["trials"]:
        tiles = {k: v for k, v in row.items() if k not in ("S", "tflops", "max_diff", "error")}
        value = f"{row['tflops']:.0f}" if "tflops" in row else row.get("error", "-")
        lines.append(f"| {row['S']} | {tiles} | {value} | {row.get('max_diff', float('nan')):.1e} |")
    lines += ["", "| S | inferq default | SDPA flash | vs flash |", "|---|---|---|---|"]
    for row in results["suite"]:
        flash = row.get("sdpa_flash_tflops", float("nan"))
        lines.append(
            f"| {row['S']} | {row['inferq_tflops']:.0f} | {flash:.0f} | {row.get('inferq_vs_sdpa_flash', 0):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    args = parser.parse_args(argv)
    device = kernel_bench_device(args.dry_run)  # before anything imports triton
    from bench.attention_suites import prefill_suite
    from bench.kernel_sweeps import sweep_prefill
    from bench.kernel_timing import Bench, measure_ceilings
    from bench.kernels import _environment

    env = _environment(device)
    bench = Bench(device=device, dry_run=args.dry_run, l2_bytes=env["l2_bytes"])
    meta = " · ".join(str(env.get(key)) for key in ("date", "gpu", "torch", "triton"))
    results: dict = {"meta": meta, "env": env, "ceilings": measure_ceilings(bench)}
    if args.dry_run:
        results["suite"] = prefill_suite(bench, (32,), 64, 4, 1, 64)
        results["trials"] = sweep_prefill(bench, (32,), 64, 4, 1, 64, tile_list=[dict(BLOCK_M=32, BLOCK_N=16,
                                          num_warps=4, num_stages=1)])  # fmt: skip
    else:
        results["suite"] = prefill_suite(bench, SEQ_LENS, 16384, 32, 8, 128)
        results["trials"] = []
        for block_size, tiles in TRIALS:
            rows = sweep_prefill(bench, SEQ_LENS, tile_list=[tiles], block_size=block_size)
            results["trials"] += [dict(row, block_size=block_size) for row in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_trials.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "prefill_trials.md").write_text(_markdown(results))
    print(_markdown(results))
    return results


if __name__ == "__main__":
    main()
