"""Offline throughput of the engine (BENCHMARKS.md): seed 0, 256 sequences, prompt and output
lengths each uniform in [100, 1024], random token ids, ignore_eos, greedy, random bf16 weights;
the workload's roofline fraction (bench/roofline.py); transformers' `generate` as the peer.

    python -m bench.offline_throughput              # on a CUDA GPU, from the repo root
    python -m bench.offline_throughput --dry-run    # CPU: tiny shape, few sequences, code paths only

The peer runs a subset (the first 64 sequences as one left-padded batch, 128 new tokens each),
once untimed and then timed: the whole workload would take it minutes. Its full-workload time is
extrapolated from that run as 4 batches of 64, each a prefill plus (longest output - 1) decode
steps at the measured step time; that ignores its attention cost growing with context, so it
flatters the peer. The untimed pass matters: transformers' sdpa runs cuDNN attention on an H100,
which builds a plan for every new context length, so a cold process's steps cost ~2x (before
2026-11-26 this subset was timed cold). bench/hf_full_workload.py measures the peer over the
whole workload instead, in workload order and grouped by output length (the least-waste order).
Writes offline_throughput.{json,md} into --out (bench/report.py's results_folder: bench/results/<gpu>/
by default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench.report import OUT_HELP

MODELS = ("Qwen3-0.6B", "Llama-3.1-8B")
NUM_SEQS, MIN_LEN, MAX_LEN = 256, 100, 1024
MAX_NUM_BATCHED_TOKENS = 8192
MAX_MODEL_LEN = 2048  # the longest prompt plus the longest output, 1024 + 1024
HF_BATCH, HF_NEW_TOKENS = 64, 128
STEM = "offline_throughput"
QUANTIZATION: str | None = None  # --quantization: the engine's linear layers quantized on the fly


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 8 short sequences")
    parser.add_argument("--skip-hf", action="store_true", help="leave out the transformers peer")
    parser.add_argument("--quantization", choices=("fp8", "int8", "int4", "nf4"), default=None,
                        help="quantize the dummy weights on the fly (docs/quantization.md)")  # fmt: skip
    args = parser.parse_args(argv)
    global QUANTIZATION
    QUANTIZATION = args.quantization
    return args


def workload(
    vocab_size: int,
    num_seqs: int,
    min_len: int,
    max_len: int,
    seed: int = 0,
    output_range: tuple[int, int] | None = None,
) -> tuple[list, list, list]:
    """(prompts, prompt lengths, output lengths): lengths uniform in [min_len, max_len] (outputs in output_range
    where given, both ends included), ids uniform in the vocab."""
    rng = np.random.default_rng(seed)
    out_lo, out_hi = output_range or (min_len, max_len)
    prompt_lens = rng.integers(min_len, max_len + 1, num_seqs).tolist()
    output_lens = rng.integers(out_lo, out_hi + 1, num_seqs).tolist()
    prompts = [rng.integers(0, vocab_size, n).tolist() for n in prompt_lens]
    return prompts, prompt_lens, output_lens


def build_engine(directory: Path, device, dry_run: bool, policy: str = "fcfs", max_background_seqs: int | None = None):
    """The workload's engine; its start-up objects frozen for the garbage collector as in
    `python -m worker` (free_device_memory unfreezes them). policy and max_background_seqs: the scheduler's, as a
    worker's settings give them (the offline workload has one priority, so fcfs)."""
    from bench.engine_common import async_scheduling_setting, freeze_long_lived_objects
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=str(directory),
                dtype="float32" if dry_run else "bfloat16",
                load_format="dummy",
                max_model_len=MAX_MODEL_LEN,
                quantization=QUANTIZATION,
            ),
            cache=CacheConfig(num_kv_tokens=8192 if dry_run else None, gpu_memory_utilization=0.9),
            scheduler=SchedulerConfig(max_num_seqs=NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                                      policy=policy, max_background_seqs=max_background_seqs),  # fmt: skip
            device=device.type,
            async_scheduling=async_scheduling_setting(),
        )
    )
    freeze_long_lived_objects()
    return engine


def run_workload(engine, prompts: list[list[int]], output_lens: list[int]) -> float:
    from engine.sampling_params import SamplingParams

    start = time.perf_counter()
    for i, (prompt, n) in enumerate(zip(prompts, output_lens, strict=True)):
        engine.add_request(f"w{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    generated = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            generated += len(out.new_token_ids)
            if out.finished and out.finish_reason != "length":
                raise RuntimeError(f"request {out.request_id} finished with {out.finish_reason}: {out.error}")
    elapsed = time.perf_counter() - start
    if generated != sum(output_lens):
        raise RuntimeError(f"generated {generated} tokens, expected {sum(output_lens)}")
    return elapsed


def _measure_engine(directory: Path, device, dry_run: bool, prompts, prompt_lens, output_lens, ceilings) -> dict:
    from bench.roofline import ModelCosts, decode_step_floor, workload_floor
    from bench.step_periods import period_by_batch
    from engine.step_timer import StepTimer

    engine = build_engine(directory, device, dry_run)
    warm_prompts, _, warm_outputs = workload(engine.vocab_size, 8, 16, 300, seed=1)
    run_workload(engine, warm_prompts, [min(o, 16) for o in warm_outputs])  # compiles the mixed-batch kernels
    engine.runner.timer = timer = StepTimer(engine.device)
    steps_before = engine.stats().num_steps
    elapsed = run_workload(engine, prompts, output_lens)
    engine.runner.timer = None
    stats = engine.stats()
    costs = ModelCosts.from_model(engine.model, engine.hf_config)
    floor = workload_floor(costs, prompt_lens, output_lens, MAX_NUM_BATCHED_TOKENS,
                           ceilings["read_gbps"], ceilings["matmul_tflops"])  # fmt: skip
    records = timer.records
    gpu_s = sum(r.gpu_ms for r in records) / 1e3
    # graphed decode steps only: mixed steps (prefill chunks) replay graphs too, up to 8,192 tokens since 2026-11-27
    decode = [r for r in records if r.graphed and r.num_tokens == r.num_seqs]
    decode_floor_s = 0.0
    for r in decode:  # the roofline of the decode steps the engine actually ran
        decode_floor_s += decode_step_floor(costs, r.num_seqs, r.context_tokens, ceilings["read_gbps"],
                                            ceilings["matmul_tflops"])  # fmt: skip
    decode_gpu_s = sum(r.gpu_ms for r in decode) / 1e3
    runner_host_s = sum(r.host_s for r in records)
    output_tokens, total_tokens = sum(output_lens), sum(output_lens) + sum(prompt_lens)
    row = {
        "elapsed_s": elapsed,
        "output_tok_s": output_tokens / elapsed,
        "total_tok_s": total_tokens / elapsed,
        "roofline": floor,
        "frac_of_roofline": floor["floor_s"] / elapsed,
        "steps": stats.num_steps - steps_before,
        "graphed_steps": sum(r.graphed for r in records),
        "preemptions": stats.num_preemptions,
        "kv_pool_tokens": stats.num_total_blocks * stats.block_size,
        "gpu_busy_s": gpu_s,
        "frac_of_roofline_gpu_time": floor["floor_s"] / gpu_s if gpu_s else None,
        "graphed_decode_gpu_s": decode_gpu_s,
        "graphed_decode_floor_s": decode_floor_s,
        "frac_of_roofline_graphed_decode_gpu": decode_floor_s / decode_gpu_s if decode_gpu_s else None,
        "other_steps_gpu_s": gpu_s - decode_gpu_s,
        "runner_host_s": runner_host_s,
        "runner_wait_s": sum(r.wait_s for r in records),
        "engine_host_outside_runner_s": elapsed - runner_host_s - sum(r.wait_s for r in records),
        "period_by_batch": period_by_batch(records),
        "costs": costs.as_dict(),
    }
    del engine
    return row


def _measure_hf(directory: Path, device, dtype, prompts, output_lens, dry_run: bool) -> dict:
    from bench.engine_common import free_device_memory, hf_model, left_padded, timed_generate

    batch = 4 if dry_run else HF_BATCH
    new_tokens = 8 if dry_run else HF_NEW_TOKENS
    model = hf_model(directory, device, dtype)
    subset = prompts[:batch]
    ids, mask = left_padded(subset, device)

    timed_generate(model, ids, mask, new_tokens, device)  # untimed: cuDNN's attention plans, every length
    prefill_s = timed_generate(model, ids, mask, 1, device)
    full_s = timed_generate(model, ids, mask, new_tokens, device)
    del model
    free_device_memory(device)
    step_s = (full_s - prefill_s) / (new_tokens - 1)
    batches = [output_lens[i : i + batch] for i in range(0, len(output_lens), batch)]
    extrapolated_s = sum(prefill_s + (max(b) - 1) * step_s for b in batches)
    return {
        "hf_subset_seqs": batch,
        "hf_subset_new_tokens": new_tokens,
        "hf_subset_s": full_s,
        "hf_subset_output_tok_s": batch * new_tokens / full_s,
        "hf_subset_total_tok_s": (sum(len(p) for p in subset) + batch * new_tokens) / full_s,
        "hf_prefill_s": prefill_s,
        "hf_step_s": step_s,
        "hf_extrapolated_s": extrapolated_s,
        "hf_extrapolated_output_tok_s": sum(output_lens) / extrapolated_s,
    }


def measure_model(name: str, device, ceilings: dict, dry_run: bool, skip_hf: bool) -> dict:
    import torch

    from bench.engine_common import free_device_memory, model_dir, vocab_size_of

    directory = model_dir(name, tiny=dry_run)
    num, lo, hi = (8, 10, 40) if dry_run else (NUM_SEQS, MIN_LEN, MAX_LEN)
    prompts, prompt_lens, output_lens = workload(vocab_size_of(directory), num, lo, hi, seed=0)
    row: dict = {"model": name, "num_seqs": num, "prompt_tokens": sum(prompt_lens), "output_tokens": sum(output_lens),
                 "quantization": QUANTIZATION}  # fmt: skip
    if not skip_hf:
        dtype = torch.float32 if dry_run else torch.bfloat16
        row.update(_measure_hf(directory, device, dtype, prompts, output_lens, dry_run))
    row.update(_measure_engine(directory, device, dry_run, prompts, prompt_lens, output_lens, ceilings))
    free_device_memory(device)
    if "hf_subset_output_tok_s" in row:
        row["speedup_vs_hf_subset"] = row["output_tok_s"] / row["hf_subset_output_tok_s"]
        row["speedup_vs_hf_extrapolated"] = row["output_tok_s"] / row["hf_extrapolated_output_tok_s"]
    return row


def markdown(results: dict) -> str:
    from bench.engine_common import header
    from bench.report import table

    rows, peers, host = [], [], []
    for name, r in results["models"].items():
        if "error" in r:
            rows.append({"model": f"{name} (error: {r['error']})"})
            continue
        rows.append({"model": name, "s": r["elapsed_s"], "out": r["output_tok_s"], "total": r["total_tok_s"],
                     "floor": r["roofline"]["floor_s"], "frac": r["frac_of_roofline"],
                     "roof_out": r["output_tokens"] / r["roofline"]["floor_s"],
                     "vs_sub": r.get("speedup_vs_hf_subset"),
                     "vs_ext": r.get("speedup_vs_hf_extrapolated")})  # fmt: skip
        host.append({"model": name, "steps": r["steps"], "graphed": r["graphed_steps"], "gpu": r["gpu_busy_s"],
                     "gpu_frac": r["frac_of_roofline_gpu_time"], "runner": r["runner_host_s"],
                     "other": r["engine_host_outside_runner_s"], "wait": r["runner_wait_s"],
                     "pre": r["preemptions"], "pool": r["kv_pool_tokens"],
                     "dec_gpu": r["graphed_decode_gpu_s"], "dec_frac": r["frac_of_roofline_graphed_decode_gpu"],
                     "mixed_gpu": r["other_steps_gpu_s"]})  # fmt: skip
        if "hf_subset_output_tok_s" in r:
            peers.append({"model": name, "seqs": r["hf_subset_seqs"], "new": r["hf_subset_new_tokens"],
                          "s": r["hf_subset_s"], "out": r["hf_subset_output_tok_s"],
                          "total": r["hf_subset_total_tok_s"], "ext_s": r["hf_extrapolated_s"],
                          "ext_out": r["hf_extrapolated_output_tok_s"]})  # fmt: skip
    parts = header(results, "inferq offline throughput") + [
        "",
        f"Seed 0, {NUM_SEQS} sequences, prompt and output lengths uniform in [{MIN_LEN}, {MAX_LEN}], random token "
        f"ids, ignore_eos, greedy, random bf16 weights; max_num_seqs {NUM_SEQS}, max_num_batched_tokens "
        f"{MAX_NUM_BATCHED_TOKENS}, CUDA graphs for decode steps. Roofline: sum over the workload's steps (ideal "
        "schedule: all prefills, then decodes) of max(bytes / read BW, FLOPs / matmul rate), bytes = weights + "
        "K/V read (bench/roofline.py).",
        "",
        table(
            rows,
            [
                ("model", "model", ""),
                ("s", "time s", ".1f"),
                ("out", "output tok/s", ",.0f"),
                ("total", "total tok/s", ",.0f"),
                ("floor", "roofline s", ".2f"),
                ("roof_out", "roofline output tok/s", ",.0f"),
                ("frac", "of roofline", ".0%"),
                ("vs_sub", "x transformers (subset)", ".1f"),
                ("vs_ext", "x transformers (extrapolated)", ".1f"),
            ],
        ),  # fmt: skip
        "",
        "Where the time went (seconds over the run): GPU busy (CUDA events per step), host time in the model "
        "runner before its sync (staging, launches, sampling), host time outside the runner (scheduler, "
        "detokenizer, outputs) and host time blocked on the GPU. 'GPU of roofline' = roofline / GPU busy time; "
        "'decode GPU of floor' = the floor of the graphed decode steps the engine ran (their batch and context "
        "lengths) / their GPU time; 'other GPU s' = the other steps (prefill chunks, alone or with decodes; "
        "graphed up to 8,192 tokens since 2026-11-27, eager before above 512).",
        "",
        table(
            host,
            [
                ("model", "model", ""),
                ("steps", "steps", ""),
                ("graphed", "graphed", ""),
                ("gpu", "GPU busy s", ".2f"),
                ("gpu_frac", "GPU of roofline", ".0%"),
                ("dec_gpu", "decode GPU s", ".2f"),
                ("dec_frac", "decode GPU of floor", ".0%"),
                ("mixed_gpu", "other GPU s", ".2f"),
                ("runner", "runner host s", ".2f"),
                ("other", "engine host s", ".2f"),
                ("wait", "blocked s", ".2f"),
                ("pre", "preemptions", ""),
                ("pool", "KV pool tokens", ","),
            ],
        ),  # fmt: skip
    ]
    if peers:
        parts += [
            "",
            f"transformers `generate` (eager, sdpa attention), the first {HF_BATCH} sequences as one left-padded "
            f"batch, {HF_NEW_TOKENS} new tokens each (measured after one untimed pass); extrapolated to the whole "
            "workload as batches of "
            f"{HF_BATCH}, each a prefill plus (longest output - 1) steps at the measured step time (flatters it: "
            "its per-step attention cost grows with context).",
            "",
            table(
                peers,
                [
                    ("model", "model", ""),
                    ("seqs", "seqs", ""),
                    ("new", "new tokens", ""),
                    ("s", "time s", ".1f"),
                    ("out", "output tok/s", ",.0f"),
                    ("total", "total tok/s", ",.0f"),
                    ("ext_s", "extrapolated s", ".0f"),
                    ("ext_out", "extrapolated output tok/s", ",.0f"),
                ],
            ),  # fmt: skip
        ]
    return "\n".join(parts) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import run_model_benchmark

    return run_model_benchmark("offline", STEM, _parse_args(argv), measure_model, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
