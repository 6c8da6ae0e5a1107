"""Batch-1 decode latency of the engine (BENCHMARKS.md): a 128-token prompt, 512 new
tokens, greedy, ignore_eos, random bf16 weights; CUDA graphs on and off; transformers'
eager `generate` on the same shape in the same run; the floor from the measured read
bandwidth.

    python -m bench.decode_latency                 # on a CUDA GPU, from the repo root
    python -m bench.decode_latency --dry-run       # CPU: a tiny shape, code paths only

Per model it reports ms/token over the decode steps (wall clock of `LLMEngine.step`, so the
host's per-step work counts), the floor (bytes per token / read bandwidth, bench/roofline.py)
and the fraction of it reached, and per step: host time (staging, launches, scheduler,
detokenizer), host time blocked on the GPU, and GPU time (CUDA events). A profile of a few
eager steps splits GPU time by kernel kind, and one of graphed steps gives each kernel's share of the
step's timeline (bench/step_profiles.py). Writes decode_latency.{json,md} into --out (bench/report.py's results_folder:
bench/results/<gpu>/ by default).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from bench.report import OUT_HELP

MODELS = ("Llama-3.2-1B", "Llama-3.1-8B")
PROMPT_LEN, NEW_TOKENS = 128, 512
HF_TOKENS = (8, 40)  # transformers is timed at two output lengths; ms/token is the slope
TTFT_REPEATS = 5
# The sampled row: what chat clients send (the greedy rows are BENCHMARKS.md's workload).
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "seed": 0}
MODES = (("graphs_on", "inferq, CUDA graphs"), ("graphs_sampling", "inferq, CUDA graphs, sampling"),
         ("graphs_off", "inferq, eager"))  # fmt: skip
STEM = "decode_latency"


QUANTIZATION: str | None = None  # --quantization: the engine's linear layers quantized on the fly


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, few tokens")
    parser.add_argument("--skip-hf", action="store_true", help="leave out the transformers peer")
    parser.add_argument("--quantization", choices=("fp8", "int8", "int4", "nf4"), default=None,
                        help="quantize the dummy weights on the fly (docs/quantization.md)")  # fmt: skip
    parser.add_argument("--gemv-min-features", type=int, default=None,
                        help="engine.ops.GEMV_MIN_FEATURES for this run: one-token projections of weights at least "
                             "this wide in both dims take kernels/gemv.py (an A/B of the dispatch)")  # fmt: skip
    parser.add_argument(
        "--norm-gemv-min-features",
        type=int,
        default=None,
        help="engine.ops.NORM_GEMV_MIN_FEATURES: the same for a pre-norm fused into the projection",
    )
    parser.add_argument(
        "--swiglu-gemv-max-features",
        type=int,
        default=None,
        help="engine.ops.SWIGLU_GEMV_MAX_FEATURES: SwiGLU inside the norm-fused gate|up up to this hidden size "
        "(0: always the SiLU-and-mul kernel after it)",
    )
    parser.add_argument("--tiles", default="",
                        help="tiles of kernels/rms_norm_gemv.py in the engine, e.g. 'BLOCK_N=4,num_warps=8' "
                             "(a prefix 'swiglu:' sets the SwiGLU form's; '/' separates the two)")  # fmt: skip
    parser.add_argument("--gemv-wide-tiles", default="",
                        help="kernels/gemv.py's WIDE_TILE in the engine (the step of grids with few programs an SM: "
                             "the 1B's o and down projections), e.g. 'BLOCK_N=2,num_warps=4'")  # fmt: skip
    parser.add_argument("--qkv-rope-tiles", default="",
                        help="tiles of kernels/rms_norm_qkv_rope.py in the engine, e.g. 'BLOCK_K=1024,num_warps=8' "
                             "(set in both of its tiles, so every grid takes them)")  # fmt: skip
    parser.add_argument(
        "--decode-merge",
        choices=("last_split", "kernel"),
        default=None,
        help="kernels.decode_split_merge.DEFAULT_MERGE: where split decode attention merges its parts; default: "
        "by head dim (choose_merge)",
    )
    parser.add_argument(
        "--fused-qkv-rope",
        choices=("on", "off"),
        default=None,
        help="engine.ops.QKV_ROPE_FUSION: the pre-norm, qkv projection, RoPE and KV store as one kernel at one "
        "token (kernels/rms_norm_qkv_rope.py); default: the engine's (on)",
    )
    parser.add_argument(
        "--pdl",
        choices=("on", "off"),
        default=None,
        help="programmatic dependent launch of the kernels (kernels/_pdl.py); default: INFERQ_PDL, on",
    )
    args = parser.parse_args(argv)
    global QUANTIZATION
    QUANTIZATION = args.quantization
    _set_norm_gemv_tiles(args.tiles)
    _set_qkv_rope_tiles(args.qkv_rope_tiles)
    if args.gemv_wide_tiles:
        import kernels.gemv

        _set_tiles(kernels.gemv.WIDE_TILE, args.gemv_wide_tiles, "--gemv-wide-tiles")
    if args.pdl is not None:
        from kernels._pdl import set_pdl

        set_pdl(args.pdl == "on")
    from engine import ops

    if args.gemv_min_features is not None:
        ops.GEMV_MIN_FEATURES = ops.GEMV_MIN_FEATURES_PDL = args.gemv_min_features
    if args.norm_gemv_min_features is not None:
        ops.NORM_GEMV_MIN_FEATURES = ops.NORM_GEMV_MIN_FEATURES_PDL = args.norm_gemv_min_features
    if args.swiglu_gemv_max_features is not None:
        ops.SWIGLU_GEMV_MAX_FEATURES = args.swiglu_gemv_max_features
    if args.fused_qkv_rope is not None:
        ops.QKV_ROPE_FUSION = args.fused_qkv_rope == "on"
    if args.decode_merge is not None:
        import kernels.decode_split_merge

        kernels.decode_split_merge.DEFAULT_MERGE = args.decode_merge
    return args


def _set_tiles(target: dict, spec: str, flag: str) -> None:
    """'BLOCK_N=4,num_warps=8' -> target's entries (a kernel module's TILES, for an engine A/B)."""
    for item in filter(None, spec.split(",")):
        key, value = item.split("=")
        if key not in target:
            raise SystemExit(f"{flag}: unknown key {key!r}; known: {tuple(target)}")
        target[key] = int(value)


def _set_norm_gemv_tiles(spec: str) -> None:
    """'BLOCK_N=4,num_warps=8/swiglu:BLOCK_N=4' -> kernels.rms_norm_gemv's TILES / SWIGLU_TILES (an engine A/B)."""
    import kernels.rms_norm_gemv as fused

    for part in filter(None, spec.split("/")):
        target = fused.SWIGLU_TILES if part.startswith("swiglu:") else fused.TILES
        _set_tiles(target, part.removeprefix("swiglu:"), "--tiles")


def _set_qkv_rope_tiles(spec: str) -> None:
    """'BLOCK_K=1024,num_warps=8' -> kernels.rms_norm_qkv_rope's TILES and WIDE_TILES (an engine A/B)."""
    import kernels.rms_norm_qkv_rope as fused

    if not spec:
        return
    _set_tiles(fused.TILES, spec, "--qkv-rope-tiles")
    _set_tiles(fused.WIDE_TILES, spec, "--qkv-rope-tiles")


def _engine(directory: Path, device, dry_run: bool):
    from bench.engine_common import async_scheduling_setting
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.llm_engine import LLMEngine

    dtype = "float32" if dry_run else "bfloat16"
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=str(directory), dtype=dtype, load_format="dummy", max_model_len=1024, quantization=QUANTIZATION
            ),
            # NOTE: no prefix caching: every measured request prefills its whole prompt, as a fresh one would.
            cache=CacheConfig(num_kv_tokens=8192, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=1024),
            device=device.type,
            async_scheduling=async_scheduling_setting(),
        )
    )


def _run_request(
    engine, prompt: list[int], new_tokens: int, sampling: dict | None = None, cpu_times: list[float] | None = None
) -> list[float]:
    """Runs one greedy request to the end; returns the wall-clock time each token reached the caller, and appends
    this thread's CPU time (time.thread_time) at each of those moments to cpu_times where given.

    NOTE: with async scheduling a token comes back from the `step()` call after the one that
    launched its step, so the times are taken per token returned, not per call.
    """
    from engine.sampling_params import SamplingParams

    choice = sampling or {"temperature": 0.0}
    engine.add_request("bench", prompt, SamplingParams(**choice, max_tokens=new_tokens, ignore_eos=True))
    arrivals = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now, cpu = time.perf_counter(), time.thread_time()
        for out in outputs:
            arrivals += [now] * len(out.new_token_ids)
            if cpu_times is not None:
                cpu_times += [cpu] * len(out.new_token_ids)
    return arrivals


def _measure_engine(engine, prompt: list[int], new_tokens: int, graphs: bool, sampling: dict | None = None) -> dict:
    from bench.engine_common import median
    from bench.long_steps import GcPasses, long_steps, long_steps_cpu, long_steps_gc, steal_ms
    from engine.step_timer import StepTimer

    runner = engine.runner
    if runner.graphs is not None:
        runner.graphs.enabled = graphs
    _run_request(engine, prompt, 16, sampling)  # warm-up of this mode
    cpu = []
    stolen_before = steal_ms()
    with GcPasses() as collector:
        ends = _run_request(engine, prompt, new_tokens, sampling, cpu)  # timed without the step timer's events
    stolen_after = steal_ms()
    if len(ends) < new_tokens:  # ignore_eos: only a sampler that gave up (NaN logits, say) ends it early
        raise RuntimeError(f"the request ended after {len(ends)} of {new_tokens} tokens: no timing")
    step_ms = [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]  # between tokens reaching the caller
    step_cpu_ms = [(b - a) * 1e3 for a, b in zip(cpu, cpu[1:])]
    typical_ms = median(step_ms)
    on_cpu = long_steps_cpu(step_ms, step_cpu_ms)  # the steps over twice the median, and the thread's CPU in them
    runner.timer = StepTimer(engine.device)
    timer_ends = _run_request(engine, prompt, min(new_tokens, 128), sampling)  # per-step host / GPU split
    prefill, decode, runner.timer = runner.timer.records[0], runner.timer.records[1:], None
    # decode[i] is the step that produced token i + 1: the gap between tokens i and i + 1 is its wall time
    timer_walls = [(b - a) * 1e3 for a, b in zip(timer_ends, timer_ends[1:])]
    ttfts = []
    for _ in range(TTFT_REPEATS):  # the prompt's first token alone: prefill, sample, read
        begin = time.perf_counter()
        ttfts.append((_run_request(engine, prompt, 1, sampling)[0] - begin) * 1e3)
    return {
        "graphs": graphs and runner.graphs is not None,
        "ttft_ms": median(ttfts),
        "ttft_ms_all": ttfts,
        "prefill_host_ms": prefill.host_s * 1e3,
        "prefill_gpu_ms": prefill.gpu_ms,
        "prefill_graphed": prefill.graphed,
        "ms_per_token": (ends[-1] - ends[0]) * 1e3 / (len(ends) - 1),
        "step_ms_median": typical_ms,
        "step_ms_max": max(step_ms),
        "steps_over_2x_median": on_cpu["long"],
        "host_ms_median": median([r.host_s * 1e3 for r in decode]),
        "wait_ms_median": median([r.wait_s * 1e3 for r in decode]),
        "gpu_ms_median": median([r.gpu_ms for r in decode]),
        "graphed_steps": sum(r.graphed for r in decode),
        "timed_steps": len(decode),
        "timer_run_long_steps": long_steps(
            timer_walls, [r.gpu_ms for r in decode], [r.host_s * 1e3 for r in decode], [r.wait_s * 1e3 for r in decode]
        ),
        "long_steps_cpu": on_cpu,
        "long_steps_gc": long_steps_gc(ends, collector.passes),
        "steal_ms": None if stolen_before is None or stolen_after is None else stolen_after - stolen_before,
    }


def _measure_hf(directory: Path, device, dtype, prompt: list[int]) -> dict:
    import torch

    from bench.engine_common import free_device_memory, hf_model, timed_generate

    model = hf_model(directory, device, dtype)
    ids = torch.tensor([prompt], device=device)
    # The first, untimed run covers every context length the timed ones meet: transformers' sdpa runs
    # cuDNN attention on an H100, which builds a plan for each new shape (~2x a step when cold,
    # docs/decisions/0030-transformers-peer-warm.md); before 2026-11-26 the 32 steps of the slope were cold.
    times = {n: timed_generate(model, ids, torch.ones_like(ids), n, device) for n in (max(HF_TOKENS),) + HF_TOKENS}
    del model
    free_device_memory(device)
    short, long = HF_TOKENS
    return {"hf_ms_per_token": (times[long] - times[short]) * 1e3 / (long - short), "hf_tokens_timed": list(HF_TOKENS)}


def measure_model(name: str, device, ceilings: dict, dry_run: bool, skip_hf: bool) -> dict:
    import torch

    from bench.engine_common import free_device_memory, freeze_long_lived_objects, model_dir, vocab_size_of
    from bench.roofline import ModelCosts, decode_token_floor
    from bench.step_profiles import profile_eager_steps, profile_graph_steps

    dtype = torch.float32 if dry_run else torch.bfloat16
    new_tokens = 24 if dry_run else NEW_TOKENS
    directory = model_dir(name, tiny=dry_run)
    rng = random.Random(0)
    prompt = [rng.randrange(0, vocab_size_of(directory)) for _ in range(PROMPT_LEN)]
    row: dict = {"model": name, "prompt_len": PROMPT_LEN, "new_tokens": new_tokens, "quantization": QUANTIZATION}
    if not skip_hf:
        row.update(_measure_hf(directory, device, dtype, prompt))
    engine_probe = _engine(directory, device, dry_run)
    freeze_long_lived_objects()
    costs = ModelCosts.from_model(engine_probe.model, engine_probe.hf_config)
    row["costs"] = costs.as_dict()
    row["graphs_on"] = _measure_engine(engine_probe, prompt, new_tokens, graphs=True)
    row["graphs_sampling"] = _measure_engine(engine_probe, prompt, new_tokens, graphs=True, sampling=SAMPLING)
    row["graphs_off"] = _measure_engine(engine_probe, prompt, new_tokens, graphs=False)
    if device.type == "cuda":
        row["eager_profile_us_per_step"] = profile_eager_steps(engine_probe, prompt)
        row["graph_profile"] = profile_graph_steps(engine_probe, prompt)
    mean_context = PROMPT_LEN + (new_tokens - 1) / 2
    floor_s = decode_token_floor(costs, mean_context, ceilings["read_gbps"], ceilings["matmul_tflops"])
    row["floor_ms_per_token"] = floor_s * 1e3
    for mode, _ in MODES:
        row[mode]["frac_of_floor"] = row["floor_ms_per_token"] / row[mode]["ms_per_token"]
        # BENCHMARKS.md's convention: every parameter byte (the input embedding too) per token
        row[mode]["weight_read_gbps"] = costs.all_param_bytes / (row[mode]["ms_per_token"] * 1e6)
        row[mode]["frac_read_bw_all_params"] = row[mode]["weight_read_gbps"] / ceilings["read_gbps"]
    if "hf_ms_per_token" in row:
        row["speedup_vs_hf"] = row["hf_ms_per_token"] / row["graphs_on"]["ms_per_token"]
    del engine_probe
    free_device_memory(device)
    return row


GOALS_MS = {"Llama-3.2-1B": 1.0, "Llama-3.1-8B": 5.9}


def markdown(results: dict) -> str:
    from bench.engine_common import header
    from bench.long_steps import long_steps_markdown
    from bench.report import table
    from bench.step_profiles import profiles_markdown

    rows = []
    for name, r in results["models"].items():
        if "error" in r:
            rows.append({"model": name, "mode": f"error: {r['error']}"})
            continue
        for mode, label in MODES:
            m = r[mode]
            rows.append({"model": name, "mode": label, "ms": m["ms_per_token"], "floor": r["floor_ms_per_token"],
                         "frac": m["frac_of_floor"], "bw": m["frac_read_bw_all_params"], "step": m["step_ms_median"],
                         "gpu": m["gpu_ms_median"], "host": m["host_ms_median"], "ttft": m["ttft_ms"],
                         "pf_host": m.get("prefill_host_ms"), "pf_gpu": m.get("prefill_gpu_ms"),
                         "goal": GOALS_MS.get(name)})  # fmt: skip
        if "hf_ms_per_token" in r:
            hf_ms = r["hf_ms_per_token"]
            rows.append({"model": name, "mode": "transformers eager generate", "ms": hf_ms,
                         "floor": r["floor_ms_per_token"], "frac": r["floor_ms_per_token"] / hf_ms})  # fmt: skip
    parts = header(results, "inferq batch-1 decode latency") + [
        "",
        f"Batch 1, {PROMPT_LEN}-token prompt, {NEW_TOKENS} new tokens, greedy, ignore_eos, random bf16 weights "
        "(load_format dummy). ms/token: wall clock of `LLMEngine.step` over the decode steps (host work included). "
        "Floor: (streamed weights + K/V read) / read bandwidth at the mean context (bench/roofline.py). "
        "'of read BW': every parameter byte per token over the read bandwidth (BENCHMARKS.md's convention). "
        "step ms: the median time between two tokens of the same run. Per step medians of a 128-token run with "
        "the step timer on: GPU (CUDA events from the forward's "
        "launch, batch already staged, to the last sampling kernel) and host time before the step's one sync "
        "(in graph mode it overlaps the GPU once the replay is launched). transformers: `generate` eager, "
        f"ms/token = slope between {HF_TOKENS[0]} and {HF_TOKENS[1]} new tokens, after an untimed run of "
        f"{HF_TOKENS[1]}. 'sampling': the same run with "
        f"{SAMPLING} instead of greedy. TTFT: median over "
        f"{TTFT_REPEATS} requests of the same prompt with max_tokens 1 (add_request to the token reaching the "
        "caller); prefill host / GPU ms: the prompt's step, split as the decode steps are.",
        "",
        table(
            rows,
            [
                ("model", "model", ""),
                ("mode", "engine", ""),
                ("ms", "ms/token", ".3f"),
                ("goal", "goal ms", ".1f"),
                ("floor", "floor ms", ".3f"),
                ("frac", "of floor", ".0%"),
                ("bw", "of read BW", ".0%"),
                ("step", "step ms", ".3f"),
                ("gpu", "GPU ms", ".3f"),
                ("host", "host ms", ".3f"),
                ("ttft", "TTFT ms", ".2f"),
                ("pf_host", "prefill host ms", ".2f"),
                ("pf_gpu", "prefill GPU ms", ".2f"),
            ],
        ),  # fmt: skip
    ]
    parts += long_steps_markdown(results, MODES)
    parts += profiles_markdown(results)
    return "\n".join(parts) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import run_model_benchmark

    return run_model_benchmark("decode", STEM, _parse_args(argv), measure_model, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
