"""Where the engine's host time goes: the offline workload (bench/offline_throughput.py) run
under cProfile, reported as the functions with the most own time and the engine's per-step
phases (schedule, stage inputs, run the model, turn outputs into text).

    python -m bench.host_profile --models Qwen3-0.6B     # on a CUDA GPU, from the repo root
    python -m bench.host_profile --dry-run               # CPU: tiny model, 16 short sequences

Why: offline throughput is host-bound for small models (Qwen3-0.6B: the GPU alone would reach
70% of the roofline, the engine 50%; bench/results/h100/engine_offline_throughput.md), and the
step timer says how much host time there is, not where. cProfile slows Python down (roughly
1.5-2x), so read the shares, not the absolute seconds. Writes host_profile.{json,md} into $OUT.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

STEM = "host_profile"
ROOT = str(Path(__file__).resolve().parents[1]) + "/"
TOP = 30
# (label, file suffix, function name): the engine's per-step phases, by cumulative time
PHASES = (
    ("engine step", "engine/llm_engine.py", "step"),
    ("schedule", "engine/scheduler.py", "schedule"),
    ("runner launch", "engine/model_runner.py", "launch"),
    ("stage inputs", "engine/input_batch.py", "prepare"),
    ("read tokens + outputs", "engine/llm_engine.py", "_collect"),
    ("outputs -> text", "engine/engine_outputs.py", "_process"),
    ("detokenize", "engine/detokenizer.py", "add_tokens"),
)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="Qwen3-0.6B")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 16 short sequences")
    return parser.parse_args(argv)


def _rows(stats: pstats.Stats) -> list[dict]:
    rows = []
    for (filename, line, name), (_, calls, own_s, cum_s, _) in stats.stats.items():
        where = filename.split(ROOT)[-1].split("site-packages/")[-1]
        rows.append({"function": f"{where}:{line}({name})", "calls": calls, "own_s": own_s, "cum_s": cum_s,
                     "file": filename, "name": name})  # fmt: skip
    return rows


def profile_model(name: str, device, dry_run: bool, num_seqs: int) -> dict:
    from bench.engine_common import free_device_memory, model_dir
    from bench.offline_throughput import MAX_LEN, MIN_LEN, build_engine, run_workload, workload

    engine = build_engine(model_dir(name, tiny=dry_run), device, dry_run)
    warm_prompts, _, warm_outputs = workload(engine.vocab_size, 8, 16, 300, seed=1)
    run_workload(engine, warm_prompts, [min(o, 16) for o in warm_outputs])  # compiles outside the profile
    n, lo, hi = (16, 8, 48) if dry_run else (num_seqs, MIN_LEN, MAX_LEN)
    prompts, _, output_lens = workload(engine.vocab_size, n, lo, hi)
    steps_before = engine.stats().num_steps
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    run_workload(engine, prompts, output_lens)
    profiler.disable()
    elapsed = time.perf_counter() - start
    steps = engine.stats().num_steps - steps_before
    rows = _rows(pstats.Stats(profiler))
    phases = {}
    for label, suffix, func in PHASES:
        match = [r for r in rows if r["file"].endswith(suffix) and r["name"] == func]
        phases[label] = sum(r["cum_s"] for r in match)
    del engine
    free_device_memory(device)
    top = sorted(rows, key=lambda r: -r["own_s"])[:TOP]
    return {"model": name, "num_seqs": n, "steps": steps, "elapsed_s": elapsed,
            "phases_ms_per_step": {k: v * 1e3 / max(1, steps) for k, v in phases.items()},
            "top_own_time": [{k: r[k] for k in ("function", "calls", "own_s", "cum_s")} for r in top]}  # fmt: skip


def markdown(results: dict) -> str:
    from bench.report import table

    meta = results["meta"]
    parts = ["# inferq host profile (cProfile of the offline workload)", "",
             f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · "
             f"python {meta['python']}"]  # fmt: skip
    parts += ["", "cProfile slows Python down: compare shares, not absolute times. Phases are cumulative "
              "(a phase includes the ones it calls).", ""]  # fmt: skip
    for name, row in results["models"].items():
        parts += [f"## {name}: {row['num_seqs']} sequences, {row['steps']} steps, {row['elapsed_s']:.1f} s profiled",
                  "", table([{"phase": k, "ms": v} for k, v in row["phases_ms_per_step"].items()],
                            [("phase", "phase", ""), ("ms", "ms per step", ".2f")]),
                  "", table(row["top_own_time"], [("function", "function", ""), ("calls", "calls", ""),
                                                  ("own_s", "own s", ".3f"), ("cum_s", "cumulative s", ".3f")]),
                  ""]  # fmt: skip
    return "\n".join(parts) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import environment, kernel_bench_device, write_results

    args = _parse_args(argv)
    device = kernel_bench_device(args.dry_run)
    results: dict = {"meta": environment(device), "models": {}}
    for name in [m for m in args.models.split(",") if m]:
        results["models"][name] = profile_model(name, device, args.dry_run, args.num_seqs)
        write_results(Path(args.out), STEM, results, markdown(results))
    print(markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
