"""Online latency under load (BENCHMARKS.md): the service (HTTP API, Redis, worker; all on the GPU machine)
under Poisson arrivals at 50% and 90% of its measured capacity, with ShareGPT-like lengths; reports TTFT and
ITL p50 / p95 / p99 and the error rate (goal: 0 errors).

    python -m bench.online_latency                          # on a CUDA GPU, repo root: Qwen3-0.6B shape
    python -m bench.online_latency --model Llama-3.1-8B
    python -m bench.online_latency --dry-run                # CPU: tiny model, short loads, code paths only

Workload (seeded): prompt lengths uniform in [100, 300] tokens and output lengths uniform in [90, 270]:
the means BENCHMARKS.md names for ShareGPT (~200 / ~180); ShareGPT's own spread is not reproduced (no
dataset here, and random token ids anyway). Random token ids, ignore_eos, greedy, streaming
POST /v1/completions (bench/online_clients.py: open loop, CLIENT_PROCS processes, 4 API replicas).

1. Capacity: CAPACITY_REQUESTS requests arrive at once; capacity = requests / seconds until the last ends
   (the service saturated: max_num_seqs 256, the rest queued).
2. Each load (LOADS of the capacity): arrivals with exponential gaps at that rate for --seconds (its own
   seed), then until every request has ended. TTFT: the request's send to its first token chunk. ITL: every
   gap between two token chunks of a stream (one token a chunk here; vLLM's benchmark_serving counts the
   same gaps). E2E: send to the stream's end. Also: requests sent late (the client's lag behind its
   schedule, which would flatter the service if large) and the achieved request and output-token rates.
Writes online_latency.{json,md} into --out (bench/report.py's results_folder: bench/results/<gpu>/ by default),
one entry a model: a run of another model adds its entry to the file it finds there, a run of the same model
replaces it. The service's logs go beside them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from bench.offline_throughput import MODELS, workload
from bench.online_clients import run_open_loop
from bench.report import OUT_HELP, results_folder
from bench.service_stack import running_stack
from bench.service_workload import percentile

STEM = "online_latency"
LOADS = (0.5, 0.9)
PROMPT_LENS, OUTPUT_LENS = (100, 300), (90, 270)
CAPACITY_REQUESTS = 512
API_REPLICAS = 4
DRY_RUN = {"prompt_lens": (8, 24), "output_lens": (4, 12), "capacity_requests": 12, "seconds": 4.0}


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen3-0.6B", choices=list(MODELS))
    parser.add_argument("--seconds", type=float, default=60.0, help="arrivals per load (then the tail ends)")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, short loads")
    return parser.parse_args(argv)


def requests_of(count: int, vocab: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int], seed: int):
    """count (prompt token ids, max_tokens) pairs, lengths uniform in the two ranges (inclusive): the offline
    workload's generator with this benchmark's ranges."""
    prompts, _, outputs = workload(vocab, count, *prompt_lens, seed=seed, output_range=output_lens)
    return list(zip(prompts, outputs, strict=True))


def poisson_arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Arrival times in [0, seconds) of a Poisson process of `rate` per second (exponential gaps)."""
    rng, times, t = random.Random(seed), [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return times
        times.append(t)


def load_figures(rows: list[dict], start_at: float, offered_rate: float | None) -> dict:
    """One load's latency figures (ms) and rates from its request rows (bench/online_clients.py)."""
    good = [r for r in rows if r["error"] is None]
    ttft = [(r["chunks"][0] - r["sent"]) * 1000 for r in good if r["chunks"]]
    itl = [(b - a) * 1000 for r in good for a, b in zip(r["chunks"], r["chunks"][1:], strict=False)]
    e2e = [(r["end"] - r["sent"]) * 1000 for r in good]
    lag = [(r["sent"] - r["due"]) * 1000 for r in rows]
    span = max(r["end"] for r in rows) - start_at
    arrivals = max(r["due"] for r in rows) - start_at

    def pcts(values: list[float]) -> dict:
        return {f"p{q}": percentile(values, q) if values else None for q in (50, 95, 99)}

    return {
        "offered_req_s": offered_rate,
        "requests": len(rows),
        "errors": len(rows) - len(good),
        "error_examples": sorted({r["error"] for r in rows if r["error"]})[:5],
        "arrival_req_s": len(rows) / arrivals if arrivals > 0 else None,
        "completed_req_s": len(good) / span,
        "output_tok_s": sum(r["completion_tokens"] for r in good) / span,
        "ttft_ms": pcts(ttft),
        "itl_ms": pcts(itl),
        "e2e_ms": pcts(e2e),
        "send_lag_ms": {"p50": percentile(lag, 50), "max": max(lag)},
    }


def _measure(args, directory: Path, out: Path) -> dict:
    # NOTE: imported here, not at the top: bench.engine_common imports torch, and the client processes (spawned)
    # import this module again, which would then take longer than their start lead
    from bench.engine_common import vocab_size_of

    shape = DRY_RUN if args.dry_run else {"prompt_lens": PROMPT_LENS, "output_lens": OUTPUT_LENS,
                                          "capacity_requests": CAPACITY_REQUESTS, "seconds": args.seconds}  # fmt: skip
    vocab = vocab_size_of(directory)
    worker_flags = ["--dry-run"] if args.dry_run else []
    with running_stack(out, directory, api_replicas=API_REPLICAS, worker_flags=worker_flags, stem=STEM) as stack:
        warm = requests_of(8, vocab, shape["prompt_lens"], (4, 16), seed=3)
        run_open_loop(stack.bases, [(0.0, p, n) for p, n in warm])
        burst = requests_of(shape["capacity_requests"], vocab, shape["prompt_lens"], shape["output_lens"], seed=10)
        rows, start_at = run_open_loop(stack.bases, [(0.0, p, n) for p, n in burst])
        capacity = load_figures(rows, start_at, None)  # all at once: no offered rate
        stack.service.check()
        if capacity["errors"]:
            raise RuntimeError(f"the capacity run had errors: {capacity['error_examples']}")
        rate = capacity["completed_req_s"]
        print(f"[online] capacity {rate:.1f} req/s, {capacity['output_tok_s']:.0f} output tok/s", flush=True)
        loads = []
        for i, fraction in enumerate(LOADS):
            due = poisson_arrivals(fraction * rate, shape["seconds"], seed=20 + i)
            jobs = requests_of(len(due), vocab, shape["prompt_lens"], shape["output_lens"], seed=30 + i)
            rows, start_at = run_open_loop(stack.bases, [(t, p, n) for t, (p, n) in zip(due, jobs, strict=True)])
            loads.append({"fraction_of_capacity": fraction, **load_figures(rows, start_at, fraction * rate)})
            print(f"[online] {fraction:.0%}: {json.dumps(loads[-1])}", flush=True)
            stack.service.check()
    return {"shape": shape, "capacity": capacity, "loads": loads}


def with_model(previous: dict | None, model: str, run: dict, meta: dict) -> dict:
    """The results file after one model's run: the other models' entries of `previous` kept, this model's
    (its date inside) put in, in the order models were first measured."""
    models = dict(previous["models"]) if previous else {}
    models[model] = {"date": meta["date"], **run}
    return {"meta": meta, "loads_of_capacity": list(LOADS), "models": models}


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        "# inferq online latency under load",
        "",
        f"{meta['gpu']} · torch {meta['torch']} · triton {meta['triton']}",
    ]
    for model, run in result["models"].items():
        lines += ["", *_model_markdown(model, run)]
    return "\n".join(lines) + "\n"


def _model_markdown(model: str, result: dict) -> list[str]:
    shape, cap = result["shape"], result["capacity"]
    lines = [
        f"## {model}",
        "",
        f"{result['date']} · {model} shape, random bf16 weights; the service as bench/service_overhead.py runs "
        f"it (HTTP API x {API_REPLICAS}, Redis, one worker; max_num_seqs 256, max_num_batched_tokens 8192, CUDA "
        "graphs). Prompts "
        f"{shape['prompt_lens'][0]}-{shape['prompt_lens'][1]} tokens and outputs {shape['output_lens'][0]}-"
        f"{shape['output_lens'][1]} (uniform; ShareGPT's means), random token ids, ignore_eos, greedy, streaming.",
        "",
        f"Capacity: {shape['capacity_requests']} requests at once completed at {cap['completed_req_s']:.1f} req/s "
        f"({cap['output_tok_s']:,.0f} output tok/s, {cap['errors']} errors). Loads: Poisson arrivals at a fraction "
        f"of it for {shape['seconds']:.0f} s each; TTFT from a request's send to its first token, ITL every gap "
        "between two tokens of a stream, E2E send to end (ms).",
        "",
        "| load | offered req/s | requests | errors | completed req/s | output tok/s | TTFT p50 / p95 / p99 | "
        "ITL p50 / p95 / p99 | E2E p50 / p99 | client lag p50 / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def trio(p: dict, keys=("p50", "p95", "p99")) -> str:
        return " / ".join("-" if p[k] is None else f"{p[k]:.1f}" for k in keys)

    for load in result["loads"]:
        lines.append(
            f"| {load['fraction_of_capacity']:.0%} | {load['offered_req_s']:.1f} | {load['requests']} | "
            f"{load['errors']} | {load['completed_req_s']:.1f} | {load['output_tok_s']:,.0f} | "
            f"{trio(load['ttft_ms'])} | {trio(load['itl_ms'])} | {trio(load['e2e_ms'], ('p50', 'p99'))} | "
            f"{load['send_lag_ms']['p50']:.1f} / {load['send_lag_ms']['max']:.1f} |"
        )
    errors = [e for load in result["loads"] for e in load["error_examples"]]
    if errors:
        lines += ["", "Errors (examples): " + "; ".join(errors)]
    return lines


def main(argv=None) -> dict:
    import torch

    from bench.engine_common import environment, model_dir, write_results

    args = _parse_args(argv)
    out = results_folder(args.out, args.dry_run)
    out.mkdir(parents=True, exist_ok=True)
    directory = model_dir(args.model, tiny=args.dry_run)
    measured = _measure(args, directory, out)
    # NOTE: after the service is stopped: a CUDA context in this process would take GPU memory from the worker
    meta = environment(torch.device("cpu" if args.dry_run else "cuda"))
    previous = out / f"{STEM}.json"
    result = with_model(json.loads(previous.read_text()) if previous.is_file() else None, args.model, measured, meta)
    write_results(out, STEM, result, markdown(result))
    print(markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
