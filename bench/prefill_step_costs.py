"""Eager prefill steps of the offline workload's engine (Qwen3-0.6B shape, random bf16 weights), timed three
ways: as served (the step timer's host launch time and GPU time), queued behind a GPU sleep (so the host's
launches are hidden and the GPU time is the kernels' own), and right after the host slept (an idle worker).

    python -m bench.prefill_step_costs --out DIR        # on a CUDA GPU

Why: in the service benchmark the worker's first prefill steps, of 1-12 sequences and 900-3,100 tokens,
took 34-41 ms each (runner host time within 1 ms of the GPU time), where the offline engine's full
8,192-token steps took 21-29 ms (bench/results/h100/session28/). Host-bound launches, a sync inside the eager
forward, the CPU the API processes took during the burst, or a GPU waking from idle would each give that.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

# (label, prompt lengths of the step's sequences)
SHAPES = (
    ("1 x 128", [128]),
    ("1 x 886", [886]),
    ("1 x 2000", [2000]),
    ("6 x ~520", [520, 530, 510, 540, 517, 520]),
    ("15 x ~546", [546] * 14 + [548]),
)
REPEATS = 5
SLEEP_CYCLES = 200_000_000  # ~0.1 s at 1.98 GHz: longer than any step's launches


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen3-0.6B")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--idle-s", type=float, default=2.0, help="the host's sleep before an 'after idle' step")
    parser.add_argument("--profile", default=None, help="cProfile 5 steps of this shape (e.g. '1 x 886') instead")
    return parser.parse_args(argv)


def _one_step(engine, lens: list[int], rng: random.Random, before=None) -> dict:
    """Adds one request per length (max_tokens 1) and runs the engine until they finish; the record of the
    step that prefilled them."""
    import torch

    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for n in lens:
        engine.add_request(f"p{rng.random()}", [rng.randrange(1, 50_000) for _ in range(n)], params)
    timer = engine.runner.timer
    timer.records.clear()
    if before is not None:
        before()
    while engine.has_unfinished_requests():
        engine.step()
    torch.cuda.synchronize()
    first = timer.records[0]
    return {"seqs": first.num_seqs, "tokens": first.num_tokens, "graphed": first.graphed,
            "host_ms": first.host_s * 1e3, "gpu_ms": first.gpu_ms}  # fmt: skip


def measure(engine, idle_s: float) -> list[dict]:
    import torch

    rng = random.Random(0)
    rows = []
    for label, lens in SHAPES:
        _one_step(engine, lens, rng)  # first of its shape: not counted
        served = [_one_step(engine, lens, rng) for _ in range(REPEATS)]
        hidden = [_one_step(engine, lens, rng, lambda: torch.cuda._sleep(SLEEP_CYCLES)) for _ in range(REPEATS)]
        idle = [_one_step(engine, lens, rng, lambda: time.sleep(idle_s)) for _ in range(2)]
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        rows.append({
            "shape": label, "seqs": served[0]["seqs"], "tokens": served[0]["tokens"], "graphed": served[0]["graphed"],
            "served_host_ms": med(served, "host_ms"), "served_gpu_ms": med(served, "gpu_ms"),
            "hidden_host_ms": med(hidden, "host_ms"), "hidden_gpu_ms": med(hidden, "gpu_ms"),
            "after_idle_host_ms": [r["host_ms"] for r in idle], "after_idle_gpu_ms": [r["gpu_ms"] for r in idle],
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def _profile(engine, lens: list[int], out: Path) -> dict:
    """cProfile over REPEATS steps of one shape (after one unprofiled): the functions with the most own time."""
    import cProfile
    import io
    import pstats

    rng = random.Random(1)
    _one_step(engine, lens, rng)
    profiler = cProfile.Profile()
    profiler.enable()
    rows = [_one_step(engine, lens, rng) for _ in range(REPEATS)]
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(45)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefill_step_profile.txt").write_text(f"{rows}\n{text.getvalue()}")
    print(rows, text.getvalue()[:6000], flush=True)
    return {"rows": rows}


def markdown(result: dict) -> str:
    lines = ["# Eager prefill steps: host launch time against the kernels' own GPU time", "",
             f"{result['meta']['date']} · {result['meta']['gpu']} · torch {result['meta']['torch']} · triton "
             f"{result['meta']['triton']} · {result['model']} shape, random bf16 weights. Medians of {REPEATS} steps; "
             f"'hidden': the step queued behind a GPU sleep, so its GPU time is the kernels' own; 'after idle': two "
             f"steps each after the host slept {result['idle_s']} s.", "",
             "| step | seqs | tokens | graphed | host ms | GPU ms | hidden: host ms | hidden: GPU ms "
             "| after idle: host / GPU ms |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["rows"]:
        idle = ", ".join(f"{h:.1f} / {g:.1f}" for h, g in zip(r["after_idle_host_ms"], r["after_idle_gpu_ms"]))
        lines.append(f"| {r['shape']} | {r['seqs']} | {r['tokens']} | {'yes' if r['graphed'] else 'no'} | "
                     f"{r['served_host_ms']:.2f} | {r['served_gpu_ms']:.2f} | {r['hidden_host_ms']:.2f} | "
                     f"{r['hidden_gpu_ms']:.2f} | {idle} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    import torch

    from bench.engine_common import environment, model_dir, write_results
    from bench.offline_throughput import build_engine
    from engine.step_timer import StepTimer

    args = _parse_args(argv)
    device = torch.device("cuda")
    engine = build_engine(Path(model_dir(args.model)), device, dry_run=False)
    engine.runner.timer = StepTimer(engine.device)
    if args.profile:
        return _profile(engine, dict(SHAPES)[args.profile], Path(args.out))
    result = {"meta": environment(device), "model": args.model, "idle_s": args.idle_s,
              "rows": measure(engine, args.idle_s)}  # fmt: skip
    write_results(Path(args.out), "prefill_step_costs", result, markdown(result))
    print(markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main()
