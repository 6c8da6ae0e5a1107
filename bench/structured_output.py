"""Structured output's cost: decode ms/token at batch 1 and batch 64 with and without a JSON-schema constraint,
the host's mask fill per token, the device's mask apply, and grammar compile times (cold and cached).

Model: bench/configs/<model> (default Llama-3.1-8B) with random weights and the synthetic byte-level tokenizer of
its vocabulary (bench/engine_common.py). The constraint is a JSON schema whose one string field takes lowercase
words (`pattern`): the mask keeps a random model's samples inside it, and the closing quote is one token of the
vocabulary, so requests run their whole max_tokens nearly always; the decode figures are the median wall time of
steps in which every request of the batch decodes (so a request that still ends early skews nothing).

Run on a GPU: python -m bench.structured_output [--out DIR]; --dry-run: a tiny model on the CPU (code paths only).
Writes structured_output.{json,md} to --out, $OUT or bench/results/<gpu>/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

STEM = "structured_output"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "pattern": "^[a-z ]+$"}},
    "required": ["answer"],
    "additionalProperties": False,
}
COMPILE_SCHEMA = {  # a larger schema for the compile figures
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 64},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z]+\\.[a-z]{2,4}$"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"]},
    },
    "required": ["name", "age", "tags"],
}  # fmt: skip


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--out", default=None)
    parser.add_argument("--dry-run", action="store_true")
    return parser.parse_args(argv)


def _engine(directory, device, dry_run: bool, max_num_seqs: int):
    from bench.engine_common import dummy_weights_engine

    cache = {"num_kv_tokens": max_num_seqs * 512, "enable_prefix_caching": False}
    scheduler = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max(1024, max_num_seqs * 64)}
    return dummy_weights_engine(directory, device, dry_run, 1024, cache, scheduler)


def _decode_run(engine, batch: int, prompt_len: int, new_tokens: int, constrained: bool) -> dict:
    """Median wall time of the steps in which all `batch` requests decode; tokens generated; finish reasons."""
    from bench.engine_common import median
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=1.0, seed=1, max_tokens=new_tokens, ignore_eos=True,
                            structured_output={"json": SCHEMA} if constrained else None)  # fmt: skip
    for i in range(batch):
        prompt = [(7 + 13 * i + 5 * j) % 200 + 1 for j in range(prompt_len)]
        engine.add_request(f"r{i}", prompt, params)
    steps, tokens, reasons = [], 0, {}
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - started
        record = engine.last_step
        if len(record.scheduled) == batch and record.num_prefill_tokens == 0:
            steps.append(elapsed * 1e3)
        for out in outputs:
            tokens += len(out.new_token_ids)
            if out.finished:
                reasons[out.finish_reason] = reasons.get(out.finish_reason, 0) + 1
    return {"ms_per_step": median(steps), "full_steps": len(steps), "tokens": tokens, "finish_reasons": reasons}


def _mask_times(engine, device, steps: int) -> dict:
    """Host fill of one row's mask per token (a matcher walked through random allowed tokens), and the device's
    apply over a batch of 64 rows of the model's vocabulary."""
    from bench.engine_common import median, synchronize
    from engine import ops
    from engine.structured_output.constraint import constraint_key
    from engine.structured_output.grammar_state import GrammarState

    service = engine.constrained.service()
    state = GrammarState(service.compile_now(constraint_key({"json": SCHEMA})))
    vocab = engine.vocab_size
    words = (vocab + 31) // 32
    host = torch.empty(1, words, dtype=torch.int32)
    generator = torch.Generator().manual_seed(0)
    fills = []
    for _ in range(steps):
        started = time.perf_counter()
        state.fill_next_mask(host, 0)
        fills.append((time.perf_counter() - started) * 1e6)
        bits = ((host[0, torch.arange(vocab) // 32] >> (torch.arange(vocab) % 32)) & 1).nonzero().flatten()
        if bits.numel() == 0 or state.ends_after(int(bits[torch.randint(bits.numel(), (1,), generator=generator)])):
            state = GrammarState(service.compile_now(constraint_key({"json": SCHEMA})))
    logits = torch.randn(64, vocab, device=device, dtype=torch.float32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (64, words), dtype=torch.int32, device=device)
    rows = torch.arange(64, dtype=torch.int32, device=device)
    applies = []
    for _ in range(20):
        synchronize(device)
        started = time.perf_counter()
        ops.apply_token_bitmask(logits, bitmask, rows)
        synchronize(device)
        applies.append((time.perf_counter() - started) * 1e6)
    return {"fill_us_per_token_median": median(fills), "fill_us_per_token_max": max(fills),
            "apply_us_batch64_median": median(applies[5:] or applies)}  # fmt: skip


def _compile_times(engine) -> dict:
    from engine.structured_output.compiler import GrammarCompileService
    from engine.structured_output.constraint import constraint_key

    started = time.perf_counter()
    service = GrammarCompileService(engine.tokenizer, engine.vocab_size, sorted(engine.eos_token_ids), timeout_s=60)
    tokenizer_info_ms = (time.perf_counter() - started) * 1e3
    out = {"tokenizer_info_ms": tokenizer_info_ms}
    for name, value in (("schema", {"json": COMPILE_SCHEMA}), ("json_object", {"json_object": True}),
                        ("regex", {"regex": "[a-z]{3,8}( [a-z]{3,8}){2,5}\\."})):  # fmt: skip
        key = constraint_key(value)
        started = time.perf_counter()
        service.compile_now(key)
        cold = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        service.compile_now(key)
        out[name] = {"cold_ms": cold, "cached_ms": (time.perf_counter() - started) * 1e3}
    service.shutdown()
    return out


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [f"# Structured output ({results['model']})", "",
             f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · async scheduling {meta['async_scheduling']}",
             "", "| batch | free ms/step | constrained ms/step | ratio | constrained finishes |",
             "|---|---|---|---|---|"]  # fmt: skip
    for batch, row in results["decode"].items():
        free, con = row["free"]["ms_per_step"], row["constrained"]["ms_per_step"]
        lines.append(
            f"| {batch} | {free:.2f} | {con:.2f} | {con / free:.3f} | {row['constrained']['finish_reasons']} |"
        )
    mask = results["mask"]
    lines += ["", f"Mask fill on the host: median {mask['fill_us_per_token_median']:.1f} us a token (max "
              f"{mask['fill_us_per_token_max']:.1f}); apply on the device, 64 rows: {mask['apply_us_batch64_median']:.1f} us.",  # noqa: E501
              "", "| compile | cold ms | cached ms |", "|---|---|---|"]  # fmt: skip
    for name, row in results["compile"].items():
        if isinstance(row, dict):
            lines.append(f"| {name} | {row['cold_ms']:.1f} | {row['cached_ms']:.3f} |")
    lines.append(f"\nTokenizer tables (once per engine): {results['compile']['tokenizer_info_ms']:.0f} ms.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import environment, model_dir, write_results
    from bench.report import results_folder

    args = _parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --dry-run")
    device = torch.device("cpu" if args.dry_run else "cuda")
    meta = environment(device)
    meta["gpu"] = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    batches = [int(b) for b in args.batches.split(",") if b]
    directory = model_dir(args.model, tiny=args.dry_run)
    engine = _engine(directory, device, args.dry_run, max(batches))
    results: dict = {"meta": meta, "model": args.model, "new_tokens": args.new_tokens, "decode": {}}
    out = results_folder(args.out, args.dry_run)
    results["compile"] = _compile_times(engine)
    results["mask"] = _mask_times(engine, device, steps=64 if args.dry_run else 512)
    for batch in batches:
        _decode_run(engine, batch, args.prompt_len, 8, constrained=False)  # warm-up
        _decode_run(engine, batch, args.prompt_len, 8, constrained=True)
        results["decode"][batch] = {
            "free": _decode_run(engine, batch, args.prompt_len, args.new_tokens, constrained=False),
            "constrained": _decode_run(engine, batch, args.prompt_len, args.new_tokens, constrained=True),
        }
        print(f"[structured] batch {batch}: {results['decode'][batch]}", flush=True)
        write_results(out, STEM, results, markdown(results))
    print(json.dumps({k: v for k, v in results.items() if k != "meta"}, indent=1))
    write_results(out, STEM, results, markdown(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
