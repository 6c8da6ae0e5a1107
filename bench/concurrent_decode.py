"""Time per output token at a few concurrent long requests (the MoE issue's "10 concurrent requests of 2,048
prompt / 1,024 output tokens", whose published peer figure is vLLM's 13.2 ms untuned on one H100 at the
Qwen3-30B-A3B shape).

    python -m bench.concurrent_decode                                  # on a CUDA GPU, from the repo root
    python -m bench.concurrent_decode --models Qwen1.5-MoE-A2.7B --requests 10
    python -m bench.concurrent_decode --dry-run                        # CPU: tiny model, code paths only

The engine alone (no HTTP), random bf16 weights of the model's real shape (load_format dummy), CUDA graphs,
greedy, ignore_eos, random prompt ids, no prefix caching. An untimed short request first (graphs and
kernels warm), then all N requests are added at once and the engine steps until they end. Per request:
TTFT (added to its first token reaching the caller) and TPOT = (last token - first token) / (output - 1),
what vLLM's benchmark_serving reports as TPOT. Floor: a decode step of N sequences at the mean context
(prompt + output / 2) by bench/roofline.py (weights and the experts N tokens touch, K/V read, over the
measured read bandwidth), per token of a request (one token a step each).
Writes concurrent_decode.{json,md} into --out (bench/report.py's results_folder).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from bench.report import OUT_HELP

STEM = "concurrent_decode"
REQUESTS, PROMPT_LEN, OUTPUT_LEN = 10, 2048, 1024
DRY = {"requests": 3, "prompt_len": 40, "output_len": 12}
PEER = {"Qwen3-30B-A3B": ("vLLM, untuned fused MoE, one H100 (published)", 13.2)}
GOAL_MS = {"Qwen3-30B-A3B": 6.5}


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="Qwen3-30B-A3B", help="comma-separated bench/configs names")
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    parser.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, short requests")
    parser.add_argument("--skip-hf", action="store_true", help="accepted for the runners' sake: there is no peer run")
    parser.add_argument("--gemv-rows-max", type=int, default=None,
                        help="engine.ops.GEMV_ROWS_MAX for an A/B of the few-rows kernels (0: off)")  # fmt: skip
    return parser.parse_args(argv)


def _engine(directory: Path, device, dry_run: bool, requests: int, max_model_len: int):
    from bench.engine_common import dummy_weights_engine

    # a dry run's pool holds every request whole; a GPU's is what 90% of its memory leaves after the weights
    cache = {"num_kv_tokens": requests * max_model_len if dry_run else None, "gpu_memory_utilization": 0.9,
             "enable_prefix_caching": False}  # fmt: skip
    return dummy_weights_engine(directory, device, dry_run, max_model_len, cache, {"max_num_seqs": max(requests, 1)})


def run_requests(engine, prompts: list[list[int]], output_len: int) -> dict[str, list[float]]:
    """Adds every prompt at once and steps to the end; per request the times its tokens reached the caller."""
    from engine.sampling_params import SamplingParams

    start = time.perf_counter()
    arrivals: dict[str, list[float]] = {}
    for i, prompt in enumerate(prompts):
        arrivals[f"c{i}"] = [start]
        engine.add_request(f"c{i}", prompt, SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.finished and out.finish_reason != "length":
                raise RuntimeError(f"request {out.request_id} finished with {out.finish_reason}: {out.error}")
            arrivals[out.request_id] += [now] * len(out.new_token_ids)
    return arrivals


def measure_model(name: str, device, ceilings: dict, dry_run: bool, shape: dict) -> dict:
    from bench.engine_common import free_device_memory, freeze_long_lived_objects, median, model_dir, vocab_size_of
    from bench.roofline import ModelCosts, decode_step_floor

    requests, prompt_len, output_len = shape["requests"], shape["prompt_len"], shape["output_len"]
    directory = model_dir(name, tiny=dry_run)
    rng = random.Random(0)
    vocab = vocab_size_of(directory)
    prompts = [[rng.randrange(0, vocab) for _ in range(prompt_len)] for _ in range(requests)]
    engine = _engine(directory, device, dry_run, requests, prompt_len + output_len)
    freeze_long_lived_objects()
    run_requests(engine, [prompts[0][:16]], 8)  # untimed: compiles, graphs, first-use allocations
    arrivals = run_requests(engine, prompts, output_len)
    costs = ModelCosts.from_model(engine.model, engine.hf_config)
    ttft = [times[1] - times[0] for times in arrivals.values()]
    tpot = [(times[-1] - times[1]) / (output_len - 1) for times in arrivals.values()]
    if any(len(times) != output_len + 1 for times in arrivals.values()):
        raise RuntimeError(f"a request did not get {output_len} tokens")
    mean_context = prompt_len + output_len / 2
    floor_s = decode_step_floor(costs, requests, requests * mean_context, ceilings["read_gbps"],
                                ceilings["matmul_tflops"])  # fmt: skip
    stats = engine.stats()
    row = {"model": name, **shape, "kv_pool_tokens": stats.num_total_blocks * stats.block_size,
           "tpot_ms_median": median(tpot) * 1e3, "tpot_ms_max": max(tpot) * 1e3, "ttft_ms_median": median(ttft) * 1e3,
           "ttft_ms_max": max(ttft) * 1e3, "floor_ms_per_token": floor_s * 1e3}  # fmt: skip
    row["frac_of_floor"] = row["floor_ms_per_token"] / row["tpot_ms_median"]
    if name in PEER:
        row["peer"], row["peer_tpot_ms"] = PEER[name]
    if name in GOAL_MS:
        row["goal_tpot_ms"] = GOAL_MS[name]
    del engine
    free_device_memory(device)
    return row


def markdown(results: dict) -> str:
    from bench.engine_common import header

    lines = header(results, "inferq time per output token at concurrent requests")
    lines += ["", "The engine alone, random bf16 weights (load_format dummy), CUDA graphs, greedy, ignore_eos; all "
              "requests added at once. TPOT: (last token - first token) / (output - 1) per request, the median and "
              "the slowest; floor: a decode step of all requests at the mean context (prompt + output / 2), "
              "bench/roofline.py.", "",
              "| model | requests | prompt | output | TPOT ms (median) | TPOT ms (max) | goal ms | floor ms | "
              "of floor | TTFT ms (median / max) | peer | peer TPOT ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results["models"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} |")
            continue
        goal = f"{r['goal_tpot_ms']:.1f}" if "goal_tpot_ms" in r else "-"
        cells = [
            name,
            r["requests"],
            r["prompt_len"],
            r["output_len"],
            f"{r['tpot_ms_median']:.2f}",
            f"{r['tpot_ms_max']:.2f}",
            goal,
            f"{r['floor_ms_per_token']:.2f}",
            f"{r['frac_of_floor']:.0%}",
            f"{r['ttft_ms_median']:.0f} / {r['ttft_ms_max']:.0f}",
            r.get("peer", "-"),
            r.get("peer_tpot_ms", "-"),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import run_model_benchmark

    args = _parse_args(argv)
    shape = dict(DRY) if args.dry_run else {"requests": args.requests, "prompt_len": args.prompt_len,
                                             "output_len": args.output_len}  # fmt: skip
    if args.dry_run:
        args.models = "Llama-3.2-1B"
    if args.gemv_rows_max is not None:
        from engine import ops

        ops.GEMV_ROWS_MAX = args.gemv_rows_max  # recorded in the results' environment

    def measure(name, device, ceilings, dry_run, _skip_hf):
        return measure_model(name, device, ceilings, dry_run, shape)

    return run_model_benchmark("concurrent", STEM, args, measure, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
