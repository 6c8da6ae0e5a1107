"""Memory (BENCHMARKS.md): the KV pool after warm-up at 90% memory utilisation, whether serving allocates
device memory after start, and how many sequences fit.

    python -m bench.memory_footprint                       # on a CUDA GPU, repo root: both model shapes
    python -m bench.memory_footprint --models Qwen3-0.6B
    python -m bench.memory_footprint --dry-run             # CPU: tiny model, code paths only

For each model (random bf16 weights): the offline benchmark's engine (bench/offline_throughput.py's
build_engine: gpu_memory_utilization 0.9, max_num_seqs 256, max_num_batched_tokens 8192, CUDA graphs), then
where the GPU's memory went after start (weights, KV pool, the rest torch holds: the graphs' pool, the
activation room the engine reserves at start, buffers; and what torch does not hold: the CUDA context and
libraries). Then it serves the offline workload (256 sequences, prompt and output lengths uniform in
[100, 1024]), 64 more requests with seeded top-p / top-k sampling, half of them with logprobs, and the
workload again at another seed, and reads torch's allocator after start and after each stage: device segments
allocated (each a cudaMalloc), reserved bytes and their peak, allocation retries, and which segments are new
(pool and size). "No per-request allocation after start" is 0 new segments in every stage and a reserved peak
at its start value (so the 90% budget holds). Sequences that fit: the pool's tokens over a sequence's tokens
rounded up to whole blocks, at the workload's mean length and at 2,048 / 8,192 tokens (the engine here caps a
sequence at 2,048; the pool holds longer ones where allowed).
Writes memory_footprint.{json,md} into --out (default $OUT).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.offline_throughput import MAX_LEN, MIN_LEN, MODELS, NUM_SEQS, build_engine, run_workload, workload
from bench.report import OUT_HELP, results_folder

STEM = "memory_footprint"
FIT_LENGTHS = (2048, 8192)
SAMPLED_REQUESTS = 64
COUNTERS = ("segment.all.allocated", "segment.all.current", "reserved_bytes.all.current", "reserved_bytes.all.peak",
            "num_alloc_retries", "num_ooms")  # fmt: skip


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, 8 short sequences")
    return parser.parse_args(argv)


def sequences_that_fit(pool_tokens: int, block_size: int, length: float) -> int:
    """Whole sequences of `length` tokens the pool holds at once (each takes whole blocks)."""
    blocks_each = -(-int(round(length)) // block_size)
    return (pool_tokens // block_size) // blocks_each


def allocator_counters(device) -> dict | None:
    """torch's allocator counters (COUNTERS) and its device segments, {(address, bytes, pool)}, under "segments"."""
    import torch

    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    segments = {(s["address"], s["total_size"], s["segment_type"]) for s in torch.cuda.memory_snapshot()
                if s["device"] == device.index or device.index is None}  # fmt: skip
    return {**{name: stats.get(name, 0) for name in COUNTERS}, "segments": segments}


def new_segments(before: dict, after: dict) -> list[str]:
    """The segments mapped between two readings, as '<pool> <MiB>' (torch's small pool holds blocks under 1 MiB)."""
    return [f"{pool} {size / 2**20:.1f} MiB" for _, size, pool in sorted(after["segments"] - before["segments"])]


def _sampled_requests(engine, vocab: int, seed: int) -> None:
    """SAMPLED_REQUESTS seeded top-p / top-k requests, every other one with logprobs, served to the end."""
    from engine.sampling_params import SamplingParams

    prompts, _, outputs = workload(vocab, SAMPLED_REQUESTS, 16, 256, seed=seed)
    for i, (prompt, n) in enumerate(zip(prompts, outputs, strict=True)):
        params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=i, max_tokens=min(n, 64), ignore_eos=True,
                                logprobs=2 if i % 2 else None)  # fmt: skip
        engine.add_request(f"s{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()


def measure(name: str, directory: Path, device, dry_run: bool) -> dict:
    import torch

    from bench.engine_common import free_device_memory

    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    engine = build_engine(directory, device, dry_run)
    stats = engine.stats()
    pool_tokens, block_size = stats.num_total_blocks * stats.block_size, stats.block_size
    kv = engine.runner.kv_cache
    weights = sum(t.numel() * t.element_size() for t in [*engine.model.parameters(), *engine.model.buffers()])
    start = allocator_counters(device)
    free_at_start = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    num, lo, hi = (8, 10, 40) if dry_run else (NUM_SEQS, MIN_LEN, MAX_LEN)
    prompts, prompt_lens, output_lens = workload(engine.vocab_size, num, lo, hi, seed=0)
    run_workload(engine, prompts, output_lens)
    after_first = allocator_counters(device)
    _sampled_requests(engine, engine.vocab_size, seed=5)
    after_sampled = allocator_counters(device)
    more_prompts, _, more_outputs = workload(engine.vocab_size, num, lo, hi, seed=1)
    run_workload(engine, more_prompts, more_outputs)  # the steady state: new prompts of the same kind
    served = allocator_counters(device)
    stages = [start, after_first, after_sampled, served]
    pairs = list(zip(stages, stages[1:], strict=False))
    segments_by_stage = [b["segment.all.allocated"] - a["segment.all.allocated"] for a, b in pairs] if start else None
    segment_sizes_by_stage = [new_segments(a, b) for a, b in pairs] if start else None
    for counters in stages:
        if counters is not None:
            counters.pop("segments")
    mean_len = (sum(prompt_lens) + sum(output_lens)) / num
    result = {
        "model": name,
        "gpu_memory_utilization": 0.9,
        "total_bytes": total,
        "weights_bytes": weights,
        "kv_pool_bytes": kv.numel() * kv.element_size(),
        "kv_pool_tokens": pool_tokens,
        "block_size": block_size,
        "used_at_start_bytes": (total - free_at_start) if total is not None else None,
        "torch_reserved_at_start_bytes": start["reserved_bytes.all.current"] if start else None,
        "allocator_at_start": start,
        "allocator_after_serving": served,
        "new_segments_while_serving": sum(segments_by_stage) if start else None,
        # in the workload's first pass, the sampled requests, the second pass (seed 1)
        "new_segments_by_stage": segments_by_stage,
        "new_segment_sizes_by_stage": segment_sizes_by_stage,
        "reserved_after_serving_bytes": served["reserved_bytes.all.current"] if served else None,
        "reserved_peak_growth_bytes": served["reserved_bytes.all.peak"] - start["reserved_bytes.all.peak"]
        if start
        else None,
        "workload_mean_tokens": mean_len,
        "fits": {"workload_mean": sequences_that_fit(pool_tokens, block_size, mean_len),
                 **{str(n): sequences_that_fit(pool_tokens, block_size, n) for n in FIT_LENGTHS}},
    }  # fmt: skip
    del engine, kv
    free_device_memory(device)
    return result


def markdown(results: dict) -> str:
    meta = results["meta"]
    gib = 2**30
    lines = [
        "# inferq memory footprint",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']}",
        "",
        "The offline benchmark's engine (gpu_memory_utilization 0.9, max_num_seqs 256, max_num_batched_tokens 8192, "
        "CUDA graphs), random bf16 weights. GiB after start; then the offline workload, 64 sampled requests "
        "(top-p / top-k, half with logprobs) and the workload again (seed 1), torch's allocator counters read "
        "after each: device segments (cudaMalloc) allocated in each stage.",
        "",
        "| model | GPU GiB | used at start | weights | KV pool (tokens) | rest held by torch | outside torch | "
        "new segments: first pass / sampled / second pass | in use after serving | reserved peak growth | "
        "sequences that fit: workload mean / 2k / 8k |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["models"]:
        fits = f"{r['fits']['workload_mean']} / {r['fits']['2048']} / {r['fits']['8192']}"
        if r["total_bytes"] is None:  # CPU dry run
            lines.append(f"| {r['model']} | - | - | {r['weights_bytes'] / gib:.3f} | {r['kv_pool_bytes'] / gib:.3f} "
                         f"({r['kv_pool_tokens']:,}) | - | - | - | - | - | {fits} |")  # fmt: skip
            continue
        rest = r["torch_reserved_at_start_bytes"] - r["weights_bytes"] - r["kv_pool_bytes"]
        outside = r["used_at_start_bytes"] - r["torch_reserved_at_start_bytes"]
        in_use = outside + r["reserved_after_serving_bytes"]
        lines.append(
            f"| {r['model']} | {r['total_bytes'] / gib:.1f} | {r['used_at_start_bytes'] / gib:.1f} "
            f"({r['used_at_start_bytes'] / r['total_bytes']:.1%}) | {r['weights_bytes'] / gib:.2f} | "
            f"{r['kv_pool_bytes'] / gib:.1f} ({r['kv_pool_tokens']:,}) | {rest / gib:.2f} | {outside / gib:.2f} | "
            f"{' / '.join(map(str, r['new_segments_by_stage']))} | "
            f"{in_use / gib:.1f} ({in_use / r['total_bytes']:.1%}) | "
            f"{r['reserved_peak_growth_bytes'] / 2**20:.0f} MiB | {fits} |"
        )
    for r in results["models"]:
        if r.get("new_segment_sizes_by_stage"):
            stages = zip(("first pass", "sampled", "second pass"), r["new_segment_sizes_by_stage"], strict=True)
            lines += ["", f"{r['model']}, segments mapped while serving: "
                      + "; ".join(f"{stage}: {', '.join(sizes) or 'none'}" for stage, sizes in stages)]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    import torch

    from bench.engine_common import environment, model_dir, write_results

    args = _parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    results = {"meta": environment(device), "models": []}
    for name in args.models.split(","):
        results["models"].append(measure(name, model_dir(name, tiny=args.dry_run), device, args.dry_run))
        write_results(results_folder(args.out, args.dry_run), STEM, results, markdown(results))
    print(markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
