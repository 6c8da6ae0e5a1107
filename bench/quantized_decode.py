"""Quantized weights in the engine: batch-1 decode ms/token, offline output tok/s and the KV pool each weight
format leaves, bf16 and every on-the-fly format in one run, at the Llama-3.2-1B and Llama-3.1-8B shapes with
random weights (load_format dummy, quantized at load).

Decode: bench/decode_latency.py's engine and measurement (CUDA graphs on, greedy, 128 new tokens after a
128-token prompt) with --quantization. Offline: bench/offline_throughput.py's engine (gpu_memory_utilization
0.9, the pool sized from what the weights leave) on a smaller workload (OFFLINE_SEQS sequences of 100..1024
prompt and output tokens) so that eight engines fit one device call.

    python -m bench.quantized_decode [--models Llama-3.1-8B,Llama-3.2-1B] [--quantizations none,fp8,int8,int4]
    python -m bench.quantized_decode --dry-run     # CPU, tiny shape
Writes quantized_decode.{json,md} into --out (bench/results/<gpu>/ by default).
"""

from __future__ import annotations

import argparse
import random
import sys

from bench import decode_latency, offline_throughput
from bench.report import OUT_HELP

MODELS = ("Llama-3.1-8B", "Llama-3.2-1B")  # the 8B first: its figures are the targets
QUANTIZATIONS = ("none", "fp8", "int8", "int4")
OFFLINE_SEQS = 128
STEM = "quantized_decode"


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--quantizations", default=",".join(QUANTIZATIONS),
                        help="'none' is the bf16 baseline; 'bf16-streaming' bf16 with the dense streaming GEMM at "
                        "2..64 tokens")  # fmt: skip
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, few tokens")
    parser.add_argument("--skip-offline", action="store_true", help="batch-1 decode only")
    args = parser.parse_args(argv)
    args.skip_hf = True
    return args


ARGS: argparse.Namespace | None = None


def _decode(name: str, device, ceilings: dict, dry_run: bool) -> dict:
    from bench.engine_common import free_device_memory, model_dir, vocab_size_of
    from bench.roofline import ModelCosts, decode_token_floor

    directory = model_dir(name, tiny=dry_run)
    rng = random.Random(0)
    prompt = [rng.randrange(0, vocab_size_of(directory)) for _ in range(decode_latency.PROMPT_LEN)]
    engine = decode_latency._engine(directory, device, dry_run)
    costs = ModelCosts.from_model(engine.model, engine.hf_config)
    new_tokens = 24 if dry_run else decode_latency.NEW_TOKENS
    row = decode_latency._measure_engine(engine, prompt, new_tokens, graphs=True)
    row["weight_gb"] = costs.all_param_bytes / 1e9
    # the quantized codes and scales are what a step streams (bench/roofline.py counts the layers' buffers)
    mean_context = decode_latency.PROMPT_LEN + (new_tokens - 1) / 2
    floor_s = decode_token_floor(costs, mean_context, ceilings["read_gbps"], ceilings["matmul_tflops"])
    row["floor_ms_per_token"] = floor_s * 1e3
    del engine
    free_device_memory(device)
    return row


def _offline(name: str, device, ceilings: dict, dry_run: bool) -> dict:
    from bench.engine_common import free_device_memory, model_dir, vocab_size_of

    directory = model_dir(name, tiny=dry_run)
    num, lo, hi = (8, 10, 40) if dry_run else (OFFLINE_SEQS, offline_throughput.MIN_LEN, offline_throughput.MAX_LEN)
    prompts, prompt_lens, output_lens = offline_throughput.workload(vocab_size_of(directory), num, lo, hi, seed=0)
    row = offline_throughput._measure_engine(directory, device, dry_run, prompts, prompt_lens, output_lens, ceilings)
    free_device_memory(device)
    keep = ("output_tok_s", "total_tok_s", "elapsed_s", "kv_pool_tokens", "frac_of_roofline", "preemptions")
    return {key: row[key] for key in keep} | {"num_seqs": num}


def measure_model(entry: str, device, ceilings: dict, dry_run: bool, skip_hf: bool) -> dict:
    """One "<model>/<quantization>" entry (main lists every pair, so the results are written after each)."""
    from engine import ops

    name, quantization = entry.rsplit("/", 1)
    dense = quantization in ("none", "bf16-streaming")
    decode_latency.QUANTIZATION = offline_throughput.QUANTIZATION = None if dense else quantization
    # "bf16-streaming": bf16 with 2..64-token projections through the dense streaming GEMM (engine.ops' A/B)
    ops.DENSE_STREAMING_MAX_TOKENS = 64 if quantization == "bf16-streaming" else 0
    row = {"model": name, "quantization": quantization, "decode": _decode(name, device, ceilings, dry_run)}
    if not ARGS.skip_offline:
        row["offline"] = _offline(name, device, ceilings, dry_run)
    return row


def markdown(results: dict) -> str:
    from bench.engine_common import header
    from bench.report import table

    rows = []
    for entry, row in results["models"].items():
        name, fmt = entry.rsplit("/", 1)
        if "error" in row:
            rows.append({"model": name, "weights": fmt, "note": row["error"][:80]})
            continue
        base = results["models"].get(f"{name}/none", {})
        off, base_off = row.get("offline", {}), base.get("offline", {})
        rows.append({
            "model": name, "weights": "bf16" if fmt == "none" else fmt, "gb": row["decode"]["weight_gb"],
            "ms": row["decode"]["ms_per_token"], "floor": row["decode"]["floor_ms_per_token"],
            "tok_s": off.get("output_tok_s"),
            "x_bf16": off["output_tok_s"] / base_off["output_tok_s"] if off and base_off else None,
            "kv": off.get("kv_pool_tokens"), "note": "",
        })  # fmt: skip
    columns = [("model", "model", ""), ("weights", "weights", ""), ("gb", "weights GB", ".2f"),
               ("ms", "decode ms/token (batch 1)", ".3f"), ("floor", "floor ms", ".3f"),
               ("tok_s", "offline output tok/s", ".0f"),
               ("x_bf16", "x bf16", ".2f"), ("kv", "KV pool tokens", ""), ("note", "", "")]  # fmt: skip
    return "\n".join(
        header(results, "inferq quantized weights: batch-1 decode and offline throughput")
        + [
            "",
            "Random weights quantized on the fly at load (int8 and fp8 per channel, int4 symmetric in groups of "
            "128; bf16 LM head and embeddings). Decode: bench/decode_latency.py's CUDA-graph mode. Offline: "
            f"bench/offline_throughput.py's engine on {OFFLINE_SEQS} sequences; KV pool: the tokens the pool "
            "holds at gpu_memory_utilization 0.9 after the weights. Floor: the codes, scales and bf16 tensors a token "
            "streams plus its K/V reads over the measured read bandwidth (bench/roofline.py).",
            "",
            table(rows, columns),
        ]
    )


def main(argv=None) -> dict:
    global ARGS
    from bench.engine_common import run_model_benchmark

    ARGS = _parse_args(argv)
    pairs = [f"{m}/{q}" for m in ARGS.models.split(",") if m for q in ARGS.quantizations.split(",") if q]
    ARGS.models = ",".join(pairs)  # each pair measured and written on its own: a later failure keeps the earlier
    return run_model_benchmark("quantized", STEM, ARGS, measure_model, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
