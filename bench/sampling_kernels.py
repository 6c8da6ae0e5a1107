"""The sort-free sampling kernels (kernels/random_sample.py) against the engine's torch sampler, over
batch sizes: what one sampled step's sampling costs.

    python -m bench.sampling_kernels            # on a CUDA GPU, from the repo root
    python -m bench.sampling_kernels --dry-run  # CPU interpreter, tiny vocabulary: code paths only

Per (rows, sampling config): the wall clock of one call with its host work, synchronized (median of
--calls; what a decode step pays when the host cannot run ahead), and the GPU time of the kernels alone
(triton.testing.do_bench, medians). Logits: random fp32 [S, V] with a peaked head, V = 128256 (the
Llama-3 vocabulary). The torch sampler is Sampler.sample_packed under the "torch" kernel backend (its
sort, softmax and noise ops). Each row also counts the rows where the two picked different tokens.
Writes sampling_kernels.{json,md} into $OUT.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench.report import table, write_json

CONFIGS = {  # name -> SamplingParams fields
    "temperature 0.8, top-p 0.95": dict(temperature=0.8, top_p=0.95),
    "temperature 1.0": dict(temperature=1.0),
    "top-k 50": dict(temperature=0.7, top_k=50),
    "top-k 20, top-p 0.8": dict(temperature=0.7, top_k=20, top_p=0.8),
}
ROWS = (1, 8, 64, 256)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


def _wall_us(fn, calls: int) -> float:
    import torch

    times = []
    for _ in range(calls):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main(argv=None) -> dict:
    args = _parse_args(argv)
    from bench.engine_common import environment, kernel_bench_device

    device = kernel_bench_device(args.dry_run)  # before triton is imported
    import torch
    import triton

    from engine import ops
    from engine.request import Request
    from engine.sampler import Sampler
    from engine.sampling_params import SamplingParams

    vocab, rows_list, calls = (5000, (1, 3), 2) if args.dry_run else (128256, ROWS, args.calls)
    sampler = Sampler()
    results: dict = {"meta": {**environment(device), "vocab": vocab}, "rows": []}
    gen = torch.Generator().manual_seed(0)
    for num_rows in rows_list:
        logits = torch.randn(num_rows, vocab, generator=gen) * 2
        logits[:, :20] += torch.linspace(8, 4, 20)  # a peaked head, as a model's next-token logits
        logits = logits.to(device)
        for name, fields in CONFIGS.items():
            requests = [Request("r", [1] * 130, SamplingParams(seed=i, **fields), frozenset({0}), seed=i)
                        for i in range(num_rows)]  # fmt: skip

            def fused(logits=logits, requests=requests):
                with ops.kernel_backend("triton"):
                    return sampler.sample_packed(logits, requests)

            def reference(logits=logits, requests=requests):
                with ops.kernel_backend("torch"):
                    return sampler.sample_packed(logits, requests)

            differ = int((fused()[0] != reference()[0]).sum())
            row = {"rows": num_rows, "config": name, "differ": differ,
                   "kernel_wall_us": _wall_us(fused, calls), "torch_wall_us": _wall_us(reference, calls)}  # fmt: skip
            if not args.dry_run:
                row["kernel_gpu_us"] = triton.testing.do_bench(fused, return_mode="median") * 1e3
                row["torch_gpu_us"] = triton.testing.do_bench(reference, return_mode="median") * 1e3
            row["speedup_wall"] = row["torch_wall_us"] / row["kernel_wall_us"]
            results["rows"].append(row)
            print(f"[sampling] {row}", flush=True)
    write_json(args.out, "sampling_kernels.json", results)
    meta = results["meta"]
    markdown = "\n".join([
        "# Sampling: the sort-free kernels against the torch sampler", "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · V = {meta['vocab']}",
        "", "wall: one call with its host work, synchronized (median); GPU: triton.testing.do_bench (median, "
        "launch gaps included); differ: rows whose tokens the two picked differently.", "",
        table(results["rows"], [
            ("rows", "rows", ""), ("config", "sampling", ""), ("kernel_wall_us", "kernel wall us", ".0f"),
            ("torch_wall_us", "torch wall us", ".0f"), ("speedup_wall", "x", ".1f"),
            ("kernel_gpu_us", "kernel GPU us", ".1f"), ("torch_gpu_us", "torch GPU us", ".1f"),
            ("differ", "differ", ""),
        ], drop_absent=True),
    ])  # fmt: skip
    Path(args.out, "sampling_kernels.md").write_text(markdown + "\n")
    print(markdown)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
