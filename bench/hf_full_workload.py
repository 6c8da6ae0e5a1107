"""transformers' `generate` over the whole offline workload, measured batch by batch: the peer
figure that bench/offline_throughput.py otherwise extrapolates from a 128-token subset.

The workload is bench/offline_throughput.py's (seed 0, 256 sequences, prompt and output lengths
uniform in [100, 1024], random token ids, ignore_eos, greedy, random bf16 weights). The peer runs
it as batches of 64 left-padded sequences (the subset's batch; at Llama-3.1-8B's shape a batch of
256 would not fit an H100 beside its weights). `generate` takes one max_new_tokens a call, so a
batch runs until its longest output is done and its shorter sequences' extra tokens are waste;
throughput counts only the tokens the workload asks for. Two orders:

- `arrival` (default): workload order, as a server that cannot know output lengths batches them.
  This is vLLM's own transformers baseline (benchmarks/benchmark_throughput.py, `--backend hf`):
  requests in dataset order, a batch closed at `--hf-max-batch-size` or before its widest prompt
  plus longest output would pass 2,048 tokens (ARRIVAL_MAX_LEN; the offline workload's lengths never
  reach it, so its batches are plain runs of 64). vLLM times it cold; ours is warm unless `--cold`.
  The offline goal's ">= 20x transformers" is judged against this peer
  (docs/decisions/0031-20x-against-the-workload-order-peer.md says why).
- `by_output`: sequences grouped by output length, so a batch's outputs end together: the least
  waste `generate` allows, given every output length in advance (ignore_eos makes them known to a
  benchmark, never to a server). The strongest static-batch peer, reported beside the bar: against
  it, 20x at Llama-3.1-8B's shape would take more than the workload's roofline (H100, 2026-11-26).

    python -m bench.hf_full_workload --models Llama-3.1-8B               # on a CUDA GPU, repo root
    python -m bench.hf_full_workload --models Llama-3.1-8B --batches 3   # the rest of a cut-off run
    python -m bench.hf_full_workload --combine a/hf_full_workload.json b/hf_full_workload.json
    python -m bench.hf_full_workload --combine a/hf_full_workload.json b/hf_full_workload.json \
        --engine c/offline_throughput.json                            # the engine ran in a call of its own
    python -m bench.hf_full_workload --dry-run                           # CPU: tiny shape, code paths

Before the timed batches, an untimed `generate` meets every context length they meet
(warm_up_steps; `--cold` leaves it out). Writes hf_full_workload.{json,md} into --out after every
batch, so a call cut off by its time limit keeps the batches it finished. Where
offline_throughput.json of the same run lies in --out, the report divides the engine's
output tok/s by the peer's (only once every batch is in).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.offline_throughput import MAX_LEN, MIN_LEN, MODELS, NUM_SEQS, workload
from bench.report import OUT_HELP, RESULTS, gpu_folder, results_folder

BATCH = 64
ORDERS = ("arrival", "by_output")
ARRIVAL_MAX_LEN = 2048  # vLLM's hf baseline never pads a batch past this many prompt + output tokens
STEM = "hf_full_workload"
ENGINE_STEM = "offline_throughput"


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--order", default=ORDERS[0], choices=ORDERS)
    parser.add_argument("--batches", default="", help="comma-separated batch indices to run (default: all)")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 8 short sequences")
    parser.add_argument("--cold", action="store_true", help="time without first meeting every context length")
    parser.add_argument("--combine", nargs="+", metavar="JSON", help="merge the batches of earlier runs' JSON files")
    parser.add_argument("--engine", nargs="+", metavar="JSON", default=[],
                        help="with --combine: offline_throughput.json files whose figures the ratio takes "
                             "(where a model's engine ran in a call of its own)")  # fmt: skip
    return parser.parse_args(argv)


def batch_indices(prompt_lens: list[int], output_lens: list[int], batch: int, order: str) -> list[list[int]]:
    """The workload's sequence indices cut into batches of at most `batch`, in `order` (see ORDERS).

    `arrival` also closes a batch early where taking the next sequence would make its widest prompt
    plus its longest output pass ARRIVAL_MAX_LEN, as vLLM's transformers baseline does.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    indices = list(range(len(output_lens)))
    if order == "by_output":
        indices.sort(key=lambda i: (output_lens[i], i))
        return [indices[i : i + batch] for i in range(0, len(indices), batch)]
    batches: list[list[int]] = []
    widest = longest = 0  # the open batch's widest prompt and longest output
    for i in indices:
        wider, longer = max(widest, prompt_lens[i]), max(longest, output_lens[i])
        if batches and len(batches[-1]) < batch and wider + longer <= ARRIVAL_MAX_LEN:
            batches[-1].append(i)
            widest, longest = wider, longer
        else:
            batches.append([i])
            widest, longest = prompt_lens[i], output_lens[i]
    return batches


def warm_up_steps(batches: list[list[int]], prompt_lens: list[int], output_lens: list[int]) -> tuple[int, int]:
    """(batch index, steps) of the warm-up: the batch with the narrowest padded prompt, run until its
    context reaches the widest batch's longest (every context length the timed batches meet, once).

    Why: transformers' sdpa runs cuDNN's attention on an H100, which builds a plan for every new
    shape. Measured (H100, 2026-11-26, Qwen3-0.6B, batch 64): 300 steps over new context lengths
    23.7 s, the same 300 again 12.1 s; so a cold process's first batch runs ~2x slower a step,
    which a long-running server would not pay. (Growing the CUDA caching allocator first changed
    nothing: batch 0 in workload order 85.7 s against 85.5 s.)
    """
    widths = [max(prompt_lens[i] for i in b) for b in batches]
    ends = [w + max(output_lens[i] for i in b) for w, b in zip(widths, batches)]
    narrowest = min(range(len(batches)), key=lambda i: widths[i])
    return narrowest, max(ends) - widths[narrowest]


def run_model(name: str, order: str, selected: list[int], device, dry_run: bool, on_batch, warm: bool) -> dict:
    """Every selected batch of the workload through transformers' generate; on_batch(row) after each."""
    import torch

    from bench.engine_common import (
        free_device_memory,
        hf_model,
        left_padded,
        model_dir,
        timed_generate,
        vocab_size_of,
    )  # fmt: skip

    directory = model_dir(name, tiny=dry_run)
    num, lo, hi, batch = (8, 10, 40, 4) if dry_run else (NUM_SEQS, MIN_LEN, MAX_LEN, BATCH)
    prompts, prompt_lens, output_lens = workload(vocab_size_of(directory), num, lo, hi, seed=0)
    batches = batch_indices(prompt_lens, output_lens, batch, order)
    row = {"model": name, "order": order, "batch": batch, "num_batches": len(batches), "num_seqs": num,
           "output_tokens": sum(output_lens), "batches": []}  # fmt: skip
    model = hf_model(directory, device, torch.float32 if dry_run else torch.bfloat16)
    ids, mask = left_padded([prompts[i] for i in batches[0][:2]], device)
    timed_generate(model, ids, mask, 4, device)  # warm-up: kernels
    row["warm_up_s"] = 0.0
    if warm:
        index, steps = warm_up_steps(batches, prompt_lens, output_lens)
        ids, mask = left_padded([prompts[i] for i in batches[index]], device)
        row["warm_up_s"] = timed_generate(model, ids, mask, steps, device)
        print(f"[hf_full] {name} warm-up: batch {index}, {steps} steps, {row['warm_up_s']:.1f} s", flush=True)
    for index in selected or range(len(batches)):
        members = batches[index]
        ids, mask = left_padded([prompts[i] for i in members], device)
        new_tokens = max(output_lens[i] for i in members)
        seconds = timed_generate(model, ids, mask, new_tokens, device)
        row["batches"].append({"index": index, "seqs": len(members), "prompt_width": ids.shape[1],
                               "new_tokens": new_tokens, "useful_tokens": sum(output_lens[i] for i in members),
                               "s": seconds})  # fmt: skip
        print(f"[hf_full] {name} {order} batch {index}: {row['batches'][-1]}", flush=True)
        on_batch(row)
    del model
    free_device_memory(device)
    return row


def summarize(row: dict, engine_tok_s: float | None) -> dict:
    """Totals over the batches present; the throughput and the engine's ratio once all are in."""
    done = {b["index"] for b in row["batches"]}
    seconds = sum(b["s"] for b in row["batches"])
    useful = sum(b["useful_tokens"] for b in row["batches"])
    generated = sum(b["seqs"] * b["new_tokens"] for b in row["batches"])
    summary = {"batches_done": len(done), "complete": done == set(range(row["num_batches"])), "s": seconds,
               "useful_tokens": useful, "generated_tokens": generated,
               "useful_fraction": useful / generated if generated else None,
               "engine_output_tok_s": engine_tok_s}  # fmt: skip
    if summary["complete"]:
        if useful != row["output_tokens"]:
            wanted = row["output_tokens"]
            raise ValueError(f"{row['model']}: batches hold {useful} output tokens, the workload {wanted}")
        summary["output_tok_s"] = useful / seconds
        if engine_tok_s:
            summary["engine_x_peer"] = engine_tok_s / summary["output_tok_s"]
    return summary


def combine(rows: list[dict]) -> dict:
    """One model's row from the rows of several runs (each batch once; the same model and order)."""
    first = rows[0]
    keys = ("model", "order", "batch", "num_batches", "num_seqs", "output_tokens")
    for other in rows[1:]:
        if any(other[k] != first[k] for k in keys):
            raise ValueError(f"runs differ in {[k for k in keys if other[k] != first[k]]}")
    if len({bool(r.get("warm_up_s")) for r in rows}) > 1:
        raise ValueError("runs differ in whether the peer was warmed up")
    merged = {k: first[k] for k in keys} | {"warm_up_s": first.get("warm_up_s", 0.0)}
    merged["batches"] = sorted((b for r in rows for b in r["batches"]), key=lambda b: b["index"])
    indices = [b["index"] for b in merged["batches"]]
    if len(indices) != len(set(indices)):
        raise ValueError(f"batch measured twice: {indices}")
    return merged


def markdown(results: dict) -> str:
    from bench.report import table

    meta = results["meta"]
    rows, batch_rows = [], []
    for name, r in results["models"].items():
        s = r["summary"]
        rows.append({"model": name, "order": r["order"], "warm": "warm" if r.get("warm_up_s") else "cold",
                     "done": f"{s['batches_done']}/{r['num_batches']}",
                     "s": s["s"], "useful": s["useful_tokens"], "frac": s["useful_fraction"],
                     "out": s.get("output_tok_s"), "engine": s.get("engine_output_tok_s"),
                     "x": s.get("engine_x_peer")})  # fmt: skip
        batch_rows += [{"model": name, **b, "tok_s": b["useful_tokens"] / b["s"]} for b in r["batches"]]
    return "\n".join([
        "# transformers over the whole offline workload",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · transformers {meta['transformers']} · "
        f"python {meta['python']}",
        "",
        f"transformers `generate` (eager, sdpa attention, random bf16 weights), the offline workload's {NUM_SEQS} "
        f"sequences (seed 0, lengths uniform in [{MIN_LEN}, {MAX_LEN}]) as left-padded batches of {BATCH}, each "
        "generating its longest output; output tok/s counts the workload's output tokens only ('useful'). "
        "Order arrival keeps workload order (vLLM's transformers baseline); by_output groups sequences of "
        "similar output length (the least-waste order). 'process': warm when an untimed generate met every "
        "context length first (warm_up_steps), else cold. 'engine' is inferq's offline output tok/s from the same run "
        "(offline_throughput.json).",
        "",
        table(rows, [("model", "model", ""), ("order", "order", ""), ("warm", "process", ""),
                     ("done", "batches", ""), ("s", "time s", ".1f"), ("useful", "output tokens", ","),
                     ("frac", "useful of generated", ".0%"),
                     ("out", "output tok/s", ",.0f"), ("engine", "engine output tok/s", ",.0f"),
                     ("x", "engine x transformers", ".1f")]),  # fmt: skip
        "",
        table(batch_rows, [("model", "model", ""), ("index", "batch", ""), ("seqs", "seqs", ""),
                           ("prompt_width", "padded prompt", ""), ("new_tokens", "steps", ""),
                           ("useful_tokens", "output tokens", ","), ("s", "time s", ".1f"),
                           ("tok_s", "output tok/s", ",.0f")]),  # fmt: skip
    ]) + "\n"


def _engine_tok_s(out: Path, name: str) -> float | None:
    path = out / f"{ENGINE_STEM}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())["models"].get(name, {}).get("output_tok_s")


def _write(out: Path, results: dict) -> None:
    from bench.engine_common import write_results

    # NOTE: a figure the row already holds (--combine's --engine, or an earlier write) wins over the folder's
    # offline_throughput.json, which in bench/results/<gpu>/ is the canonical run, not this machine's
    for name, row in results["models"].items():
        row["summary"] = summarize(row, row.get("summary", {}).get("engine_output_tok_s") or _engine_tok_s(out, name))
    write_results(out, STEM, results, markdown(results))


def main(argv=None) -> dict:
    import torch

    from bench.engine_common import environment

    args = _parse_args(argv)
    out = results_folder(args.out, args.dry_run)
    if args.combine:
        runs = [json.loads(Path(p).read_text()) for p in args.combine]
        if not args.out and not os.environ.get("OUT"):  # the runs' GPU kind, not this machine's
            out = RESULTS / gpu_folder(runs[0]["meta"].get("gpu"))
        engines = [json.loads(Path(p).read_text())["models"] for p in args.engine]
        results = {"meta": runs[0]["meta"], "combined_from": [r["meta"]["date"] for r in runs], "models": {}}
        for name in dict.fromkeys(n for r in runs for n in r["models"]):
            parts = [r["models"][name] for r in runs if name in r["models"]]
            results["models"][name] = combine(parts)
            engine = [e[name].get("output_tok_s") for e in engines if name in e]
            engine += [p["summary"].get("engine_output_tok_s") for p in parts if p.get("summary")]
            results["models"][name]["summary"] = {"engine_output_tok_s": next((e for e in engine if e), None)}
        _write(out, results)
        print(markdown(results), flush=True)
        return results
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --dry-run")
    device = torch.device("cpu" if args.dry_run else "cuda")
    selected = [int(i) for i in args.batches.split(",") if i]
    results: dict = {"meta": environment(device), "models": {}}
    for name in [m for m in args.models.split(",") if m]:

        def keep(row: dict) -> None:
            results["models"][row["model"]] = row
            _write(out, results)

        run_model(name, args.order, selected, device, args.dry_run, keep, warm=not args.cold)
    print(markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
