"""Tensor parallelism on the GPUs of one host (docs/tensor-parallelism.md): batch-1 decode and a small offline
workload at each tensor-parallel size, against size 1 and against rank 0's floor, and what the all-reduces cost.

    python -m bench.tensor_parallel                                   # Llama-3.1-8B at sizes 1 and 2
    python -m bench.tensor_parallel --models Llama-3.1-70B --sizes 4  # the 70B shape on 4 GPUs
    python -m bench.tensor_parallel --dry-run --sizes 1,2             # CPU, gloo, tiny shape: code paths only

Per model and size (random bf16 weights, load_format dummy; CUDA graphs, the engine's default):
- batch-1 decode: bench/decode_latency.py's measurement (a 128-token prompt, NEW_TOKENS greedy tokens,
  ignore_eos), its ms/token against the floor of rank 0 (the bytes rank 0 streams a token, its shard of the
  weights, the whole LM head (decision 0061) and its KV heads' K/V at the mean context, over the read bandwidth
  measured on cuda:0; of an untied input embedding only the token's row counts, as in bench/roofline.py; the
  JSON keeps every parameter byte too, rank0_param_bytes), and its ratio to size 1's ms/token;
- offline: OFFLINE_SEQS sequences, prompt and output lengths uniform in [MIN_LEN, MAX_LEN], seed 0, ignore_eos;
  output tok/s and its ratio to size 1.
Before any engine, for each size > 1, bench/all_reduce_cost.py times the all-reduce in processes of its own:
[1, H] and [64, H] bf16 messages and a 256 MiB buffer (bus bandwidth); a decode step's 2 L + 1 all-reduces of
[1, H] give its all-reduce time and share of the ms/token.

A size larger than the GPUs this process sees is skipped, with a note in the report. Each size builds one engine
(both measurements) and closes it (its ranks end) before the next. Writes tensor_parallel.{json,md} into --out
(bench/report.py's results_folder), rewritten after each step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
from pathlib import Path

from bench.report import OUT_HELP

MODELS = ("Llama-3.1-8B",)
SIZES = "1,2"
NEW_TOKENS = 256  # batch-1 decode, after decode_latency.PROMPT_LEN prompt tokens
OFFLINE_SEQS, MIN_LEN, MAX_LEN = 64, 100, 512
MAX_MODEL_LEN = 1024  # the longest prompt plus the longest output
MAX_NUM_BATCHED_TOKENS = 2048
# NOTE: every sequence of the offline workload fits at once, at every size: no preemption to compare
NUM_KV_TOKENS = OFFLINE_SEQS * MAX_MODEL_LEN
# BENCHMARKS.md's goals: (model, size) -> (figure, bound, "<=" or ">=")
GOALS = {("Llama-3.1-8B", 2): ("ratio_to_size_1", 0.62, "<="), ("Llama-3.1-70B", 4): ("frac_of_floor", 0.80, ">=")}
STEM = "tensor_parallel"


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sizes", default=SIZES, help="tensor-parallel sizes, e.g. 1,2 or 4")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny shape, few tokens")
    args = parser.parse_args(argv)
    try:
        args.sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    except ValueError:
        raise SystemExit(f"--sizes must be integers separated by commas, got {args.sizes!r}") from None
    if not args.sizes or min(args.sizes) < 1:
        raise SystemExit(f"--sizes must name sizes >= 1, got {args.sizes}")
    return args


def _engine(directory: Path, device, size: int, dry_run: bool):
    from bench.engine_common import async_scheduling_setting, freeze_long_lived_objects
    from engine.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=str(directory),
                dtype="float32" if dry_run else "bfloat16",
                load_format="dummy",
                max_model_len=MAX_MODEL_LEN,
            ),
            # NOTE: no prefix caching: every request prefills its whole prompt, as a fresh one would
            cache=CacheConfig(num_kv_tokens=NUM_KV_TOKENS, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=OFFLINE_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS),
            device=device.type,
            async_scheduling=async_scheduling_setting(),
            parallel=ParallelConfig(tensor_parallel_size=size),
        )
    )
    freeze_long_lived_objects()
    return engine


def _rank0_costs(engine, size: int):
    """bench/roofline.py's coefficients of rank 0's shard: its parameters (the whole LM head among them) and
    KV heads; each rank attends with Hq / N query heads."""
    from bench.roofline import ModelCosts

    costs = ModelCosts.from_model(engine.model, engine.hf_config)
    return dataclasses.replace(costs, attention_flops_per_key=costs.attention_flops_per_key // size)


def _decode(engine, costs, vocab_size: int, ceilings: dict, dry_run: bool) -> dict:
    from bench import decode_latency
    from bench.roofline import decode_token_floor

    rng = random.Random(0)
    prompt = [rng.randrange(0, vocab_size) for _ in range(decode_latency.PROMPT_LEN)]
    new_tokens = 16 if dry_run else NEW_TOKENS
    row = decode_latency._measure_engine(engine, prompt, new_tokens, graphs=True)
    mean_context = decode_latency.PROMPT_LEN + (new_tokens - 1) / 2
    row["new_tokens"] = new_tokens
    row["rank0_bytes_per_token"] = costs.weight_bytes + costs.kv_bytes_per_token * (mean_context + 1)
    row["floor_ms_per_token"] = decode_token_floor(costs, mean_context, ceilings["read_gbps"],
                                                   ceilings["matmul_tflops"]) * 1e3  # fmt: skip
    row["frac_of_floor"] = row["floor_ms_per_token"] / row["ms_per_token"]
    return row


def _offline(engine, costs, vocab_size: int, ceilings: dict, dry_run: bool) -> dict:
    from bench.offline_throughput import run_workload, workload
    from bench.roofline import workload_floor

    num, lo, hi = (8, 10, 40) if dry_run else (OFFLINE_SEQS, MIN_LEN, MAX_LEN)
    warm_prompts, _, warm_outputs = workload(vocab_size, 8, 10 if dry_run else 16, 40 if dry_run else 300, seed=1)
    run_workload(engine, warm_prompts, [min(o, 16) for o in warm_outputs])  # builds the mixed steps' kernels
    prompts, prompt_lens, output_lens = workload(vocab_size, num, lo, hi, seed=0)
    before = engine.stats()
    elapsed = run_workload(engine, prompts, output_lens)
    after = engine.stats()
    floor = workload_floor(costs, prompt_lens, output_lens, MAX_NUM_BATCHED_TOKENS, ceilings["read_gbps"],
                           ceilings["matmul_tflops"])  # fmt: skip
    return {
        "num_seqs": num,
        "prompt_tokens": sum(prompt_lens),
        "output_tokens": sum(output_lens),
        "elapsed_s": elapsed,
        "output_tok_s": sum(output_lens) / elapsed,
        "total_tok_s": (sum(output_lens) + sum(prompt_lens)) / elapsed,
        "rank0_roofline_s": floor["floor_s"],
        "frac_of_rank0_roofline": floor["floor_s"] / elapsed,
        "steps": after.num_steps - before.num_steps,
        "preemptions": after.num_preemptions - before.num_preemptions,
    }


def measure_size(directory: Path, size: int, device, ceilings: dict, dry_run: bool) -> dict:
    """Batch-1 decode and the offline workload on one engine of `size` ranks, closed before returning."""
    from bench.engine_common import free_device_memory, vocab_size_of

    vocab_size = vocab_size_of(directory)
    engine = _engine(directory, device, size, dry_run)
    try:
        costs = _rank0_costs(engine, size)
        row = {
            "tensor_parallel_size": size,
            "rank0_param_bytes": costs.all_param_bytes,
            "rank0_streamed_weight_bytes": costs.weight_bytes,
            "kv_pool_blocks": engine.runner.num_blocks,
            "kv_pool_tokens": engine.runner.num_blocks * engine.config.cache.block_size,
            "costs": costs.as_dict(),
        }
        row["decode"] = _decode(engine, costs, vocab_size, ceilings, dry_run)
        row["offline"] = _offline(engine, costs, vocab_size, ceilings, dry_run)
    finally:
        engine.close()  # the ranks end and the process group goes: the next engine builds its own
        del engine
        free_device_memory(device)
    return row


def _compare(results: dict, name: str, size: int) -> None:
    """A size's ratios to size 1, its all-reduce share and its goal, from what the run has measured so far."""
    from bench.all_reduce_cost import decode_step_share

    model = results["models"][name]
    row, base = model["sizes"][str(size)], model["sizes"].get("1", {})
    if "error" in row:
        return
    if "decode" in base:
        row["ratio_to_size_1"] = row["decode"]["ms_per_token"] / base["decode"]["ms_per_token"]
        row["offline_ratio_to_size_1"] = row["offline"]["output_tok_s"] / base["offline"]["output_tok_s"]
    reduce = results["all_reduce"].get(str(size), {})
    if "messages" in reduce:
        shape = model["shape"]
        row["all_reduce_per_step"] = decode_step_share(reduce, shape["hidden_size"], shape["num_layers"],
                                                       row["decode"]["ms_per_token"])  # fmt: skip
    if (name, size) in GOALS:
        figure, bound, sense = GOALS[name, size]
        value = row.get(figure, row["decode"].get(figure))
        met = None if value is None else (value <= bound if sense == "<=" else value >= bound)
        row["goal"] = {"figure": figure, "bound": bound, "sense": sense, "value": value, "met": met}


def _shape(directory: Path) -> dict:
    from bench.engine_common import text_config

    text = text_config(json.loads((directory / "config.json").read_text()))
    return {"hidden_size": int(text["hidden_size"]), "num_layers": int(text["num_hidden_layers"]),
            "num_attention_heads": int(text["num_attention_heads"]),
            "num_key_value_heads": int(text.get("num_key_value_heads", text["num_attention_heads"]))}  # fmt: skip


def _usable_sizes(sizes: list[int], dry_run: bool) -> tuple[list[int], dict]:
    """The sizes this machine can run, and a note for each it cannot (a dry run runs any: gloo on the CPU)."""
    import torch

    if dry_run:
        return sizes, {}
    gpus = torch.cuda.device_count()
    skipped = {str(s): f"needs {s} GPUs; this process sees {gpus}" for s in sizes if s > gpus}
    return [s for s in sizes if s <= gpus], skipped


def main(argv=None) -> dict:
    import torch

    from bench.all_reduce_cost import measure_all_reduce
    from bench.engine_common import ceilings, environment, free_device_memory, model_dir, write_results
    from bench.report import results_folder
    from bench.roofline import check_arithmetic
    from bench.tensor_parallel_report import markdown

    args = _parse_args(argv)
    check_arithmetic()
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on GPUs, or pass --dry-run")
    # NVLink multicast stays off unless the caller turns it on (docs/tensor-parallelism.md: shared hosts)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    device = torch.device("cpu" if args.dry_run else "cuda")
    sizes, skipped = _usable_sizes(args.sizes, args.dry_run)
    meta = environment(device) | {"gpus": 0 if args.dry_run else torch.cuda.device_count(),
                                  "nccl_nvls_enable": os.environ["NCCL_NVLS_ENABLE"]}  # fmt: skip
    results: dict = {"meta": meta, "ceilings": ceilings(device, args.dry_run), "sizes": sizes,
                     "skipped_sizes": skipped, "all_reduce": {}, "models": {}}  # fmt: skip
    free_device_memory(device)
    print(f"[tp] {results['meta']} {results['ceilings']} sizes {sizes} skipped {skipped}", flush=True)
    out = results_folder(args.out, args.dry_run)
    names = [m for m in args.models.split(",") if m]
    directories = {name: model_dir(name, tiny=args.dry_run) for name in names}
    for name in names:
        results["models"][name] = {"shape": _shape(directories[name]), "sizes": {}}
    hidden_sizes = [results["models"][name]["shape"]["hidden_size"] for name in names]
    for size in [s for s in sizes if s > 1]:  # before any engine: its processes end before the engines' start
        try:
            results["all_reduce"][str(size)] = measure_all_reduce(size, hidden_sizes, args.dry_run)
        except Exception as exc:  # keep the engines' figures; the error goes into the report
            results["all_reduce"][str(size)] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[tp] all-reduce, {size} ranks: {results['all_reduce'][str(size)]}", flush=True)
        write_results(out, STEM, results, markdown(results))
    for name in names:
        for size in sizes:
            try:
                row = measure_size(directories[name], size, device, results["ceilings"], args.dry_run)
            except Exception as exc:  # keep the other sizes' figures
                import traceback

                traceback.print_exc()
                row = {"error": f"{type(exc).__name__}: {exc}"}
            results["models"][name]["sizes"][str(size)] = row
            _compare(results, name, size)
            print(f"[tp] {name} at {size}: {row}", flush=True)
            write_results(out, STEM, results, markdown(results))
    print(markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
