"""Where the offline workload's decode steps lose time: the graphed decode step's timeline by kernel
at the batches the offline benchmark (bench/offline_throughput.py) passes through, each kernel kind
against its floor.

    python -m bench.decode_batch_profile --models Qwen3-0.6B --steps-at 1,300,600,800,950
    python -m bench.decode_batch_profile --dry-run          # CPU: tiny shape, code paths only

For each decode step k of `--steps-at`, the batch is the offline workload's at that step (seed 0, the
sequences whose output is longer than k, each with context prompt + k): those sequences are prefilled
with random ids of that length, run a few decode steps, then `--profile-steps` graphed decode steps go
through torch.profiler (bench/step_profiles.py's timeline: a kernel's marginal time is how far it moves
the end of the work before it). Floors, at the read bandwidth and matmul rate measured in the same run:
attention = the K/V bytes the step reads; projections = max(weight bytes, FLOPs) of every projection and
the LM head; the step = bench/roofline.py's step cost. Why this exists: the offline benchmark's decode
steps reach ~80% of their floor while decode attention alone reads 96-97% of the bandwidth in the
kernel bench (session 19), so the rest of the step, or the batches between, hold the loss.
Writes decode_batch_profile.{json,md} into --out.
"""

from __future__ import annotations

import argparse
import os

STEM = "decode_batch_profile"
PROFILE_STEPS = 8
WARM_STEPS = 3
# More than the ~20 mixed prefill steps of the largest batch plus the warm and profiled steps, and
# within max_model_len (2048) of the longest context profiled (1024 + 950).
MAX_NEW_TOKENS = 64


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="Qwen3-0.6B")
    parser.add_argument("--steps-at", default="1,300,600,800,950", help="offline decode steps whose batch to profile")
    parser.add_argument("--profile-steps", type=int, default=PROFILE_STEPS)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, few short sequences")
    parser.add_argument("--skip-hf", action="store_true", help="(no peer here; accepted for the shared driver)")
    return parser.parse_args(argv)


def offline_batch(vocab_size: int, step: int, dry_run: bool) -> list[list[int]]:
    """The offline workload's decode batch at `step`: one prompt of context length p + step per sequence
    whose output is longer than step (random ids: the weights are random too)."""
    import numpy as np

    from bench.offline_throughput import MAX_LEN, MIN_LEN, NUM_SEQS, workload

    num_seqs, lo, hi = (6, 8, 24) if dry_run else (NUM_SEQS, MIN_LEN, MAX_LEN)
    _, prompt_lens, output_lens = workload(vocab_size, num_seqs, lo, hi)
    rng = np.random.default_rng(step)
    return [rng.integers(0, vocab_size, p + step).tolist()
            for p, o in zip(prompt_lens, output_lens, strict=True) if o > step]  # fmt: skip


def _profile_batch(engine, prompts: list[list[int]], num_steps: int) -> tuple[dict, list]:
    """Prefills `prompts`, runs WARM_STEPS decode steps, then profiles num_steps graphed decode steps;
    returns their timeline and StepTimer records (batch size, context, graphed: what was measured).

    NOTE: each request may generate MAX_NEW_TOKENS, more than the mixed prefill steps plus the warm and
    profiled ones, so no sequence finishes inside the profile; the rest is aborted after it.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.step_profiles import profiled_timeline
    from engine.sampling_params import SamplingParams
    from engine.step_timer import StepTimer

    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    ids = [f"b{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    started: set[str] = set()
    while len(started) < len(prompts):  # every prompt prefilled: the steps from here are decode-only
        started |= {out.request_id for out in engine.step() if out.new_token_ids}
    for _ in range(WARM_STEPS):
        engine.step()
    on_cuda = engine.device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize()
    engine.runner.timer = timer = StepTimer(engine.device)
    with profile(activities=[ProfilerActivity.CUDA if on_cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(num_steps):
            engine.step()
        if on_cuda:
            torch.cuda.synchronize()
    engine.runner.timer = None
    for request_id in ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return profiled_timeline(prof, num_steps), timer.records


def _floors_us(costs, records: list, ceil: dict) -> dict:
    """The profiled steps' mean floors in us: attention (K/V read), projections + LM head (weights or
    FLOPs), the step (bench/roofline.py), from each step's batch and context as the engine ran it."""
    from bench.roofline import decode_step_floor, step_seconds

    gbps, tflops = ceil["read_gbps"], ceil["matmul_tflops"]
    sums = {"attention": 0.0, "projections": 0.0, "step": 0.0}
    for r in records:
        batch, keys = r.num_seqs, float(r.context_tokens)
        sums["attention"] += costs.kv_bytes_per_token * keys / (gbps * 1e9)
        proj_flops = 2 * (costs.projection_params + costs.lm_head_params) * batch
        sums["projections"] += step_seconds(costs.weight_bytes, proj_flops, gbps, tflops)
        sums["step"] += decode_step_floor(costs, batch, keys, gbps, tflops)
    return {k: v * 1e6 / max(len(records), 1) for k, v in sums.items()}


def _by_kind(timeline: dict) -> dict:
    from bench.step_profiles import kernel_kind

    kinds: dict[str, float] = {}
    for name, (_calls, _inside, marginal, _gap) in timeline.get("kernels", {}).items():
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + marginal
    return {k: round(v, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}


def measure_model(
    name: str, device, ceil: dict, dry_run: bool, skip_hf: bool, steps_at=(), num_steps=PROFILE_STEPS
) -> dict:
    from bench.engine_common import free_device_memory, model_dir
    from bench.offline_throughput import build_engine
    from bench.roofline import ModelCosts

    directory = model_dir(name, tiny=dry_run)
    engine = build_engine(directory, device, dry_run)
    costs = ModelCosts.from_model(engine.model, engine.hf_config)
    rows = []
    try:
        for step in steps_at:
            prompts = offline_batch(engine.vocab_size, step, dry_run)
            timeline, records = _profile_batch(engine, prompts, num_steps)
            floors = _floors_us(costs, records, ceil)
            batches = sorted({r.num_seqs for r in records})
            decode_only = all((r.graphed or dry_run) and r.num_tokens == r.num_seqs for r in records)
            if batches != [len(prompts)] or not decode_only:
                raise RuntimeError(f"step {step}: profiled steps were not all graphed decode steps of "
                                   f"{len(prompts)} sequences: batches {batches}")  # fmt: skip
            keys = round(sum(r.context_tokens for r in records) / len(records))
            rows.append({"step": step, "batch": len(prompts), "keys": keys, "gpu_us": round(
                         sum(r.gpu_ms for r in records) * 1e3 / len(records), 1),
                         "floors_us": {k: round(v, 1) for k, v in floors.items()},
                         "by_kind_us": _by_kind(timeline), "timeline": timeline})  # fmt: skip
            print(f"[batch-profile] {name} step {step}: B={len(prompts)} busy {timeline.get('busy_us_per_step')} "
                  f"floor {floors['step']:.1f} us; {rows[-1]['by_kind_us']}", flush=True)  # fmt: skip
    finally:
        del engine
        free_device_memory(device)
    return {"rows": rows}


def _summary_row(r: dict) -> dict:
    """One profiled step's row of the report: its timeline, kinds and floors side by side."""
    t, kinds, floors = r["timeline"], r["by_kind_us"], r["floors_us"]
    busy = t.get("busy_us_per_step")
    return {
        "step": r["step"], "batch": r["batch"], "keys": r["keys"], "gpu": r["gpu_us"], "busy": busy or 0.0,
        "idle": t.get("idle_us_per_step", 0.0), "floor": floors["step"],
        "of_floor": floors["step"] / busy if busy else None,
        "attention": kinds.get("attention", 0.0), "attention_floor": floors["attention"],
        "gemm": kinds.get("gemm", 0.0), "proj_floor": floors["projections"],
        "rest": sum(v for k, v in kinds.items() if k not in ("attention", "gemm")),
    }  # fmt: skip


def markdown(results: dict) -> str:
    from bench.engine_common import header
    from bench.report import table

    parts = header(results, "Decode steps of the offline workload by kernel kind") + [
        "",
        "Graphed decode steps at the offline workload's batch of the given step (bench/decode_batch_profile.py), "
        "us per step: GPU from CUDA events without the profiler, busy and idle from the profiled stream's "
        "timeline, each kind's marginal time (how far its kernels move the end of the work), and the floors "
        "at the bandwidth and matmul rate above.",
    ]
    columns = [
        ("step", "step", "d"), ("batch", "batch", "d"), ("keys", "keys", "d"), ("gpu", "GPU us", ".0f"),
        ("busy", "busy us", ".0f"), ("idle", "idle us", ".0f"), ("floor", "floor us", ".0f"),
        ("of_floor", "of floor", ".0%"), ("attention", "attention us", ".0f"), ("attention_floor", "its floor", ".0f"),
        ("gemm", "projections us", ".0f"), ("proj_floor", "their floor", ".0f"), ("rest", "the rest us", ".0f"),
    ]  # fmt: skip
    for name, model in results["models"].items():
        if "error" in model:
            parts += ["", f"{name}: {model['error']}"]
            continue
        parts += ["", f"## {name}", "", table([_summary_row(r) for r in model["rows"]], columns)]
        for r in model["rows"]:
            kernels = list(r["timeline"].get("kernels", {}).items())[:12]
            parts += ["", f"{name}, step {r['step']} (B = {r['batch']}): largest kernels, us per step "
                      "(calls, inside, marginal, gap before)", ""]  # fmt: skip
            parts += [f"- `{k}`: {v[0]:.0f} calls, {v[1]:.1f} / {v[2]:.1f} / {v[3]:.1f}" for k, v in kernels]
    return "\n".join(parts) + "\n"


def main(argv=None) -> dict:
    from functools import partial

    from bench.engine_common import run_model_benchmark

    args = _parse_args(argv)
    steps_at = [int(s) for s in args.steps_at.split(",") if s]
    from bench.offline_throughput import MAX_LEN, MAX_MODEL_LEN

    last = MAX_MODEL_LEN - MAX_LEN - MAX_NEW_TOKENS  # the longest prompt at that step still fits
    if any(not 1 <= k <= last for k in steps_at):
        raise SystemExit(f"--steps-at takes decode steps in [1, {last}], got {args.steps_at}")
    measure = partial(measure_model, steps_at=steps_at, num_steps=args.profile_steps)
    return run_model_benchmark("batch-profile", STEM, args, measure, markdown)


if __name__ == "__main__":
    main()
