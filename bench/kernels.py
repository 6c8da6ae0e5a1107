"""Kernel benchmarks of /work/shared/BENCHMARKS.md in one run: ceilings, prefill and
decode attention, and the memory-bound kernels, against torch in the same process.

    python -m bench.kernels              # on a CUDA GPU, from the repo root
    python -m bench.kernels --dry-run    # CPU: one tiny case of each through the Triton interpreter

Writes kernels.json and kernels.md into --out (bench/report.py's results_folder: bench/results/<gpu>/
by default), with the date, GPU name and torch/triton versions. Figures are fractions of the ceilings
measured in the same run and ratios to the torch peers measured beside them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from bench.report import OUT_HELP, results_folder, table

SUITES = ("prefill", "decode", "small")
PREFILL_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
DECODE_CASES = ((1, 4096), (1, 65536), (16, 4096), (64, 2048), (256, 1024))
DECODE_HEADS = (32, 8, 128)  # Hq, Hkv, D: Llama-3-8B's
SMALL_OPS = ("rms_norm", "fused_add_rms_norm", "rope", "silu_and_mul", "store_kv", "rope_store_kv")
SMALL_TOKENS = (1, 64, 4096, 32768)
SMALL_HIDDENS = (2048, 4096, 8192)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="one tiny case of each on the CPU interpreter")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated subset of {SUITES}")
    parser.add_argument("--sweep", action="store_true", help="also sweep the attention kernels' tile sizes and splits")
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per block of the attention suites' paged pool (default: the engine's)",
    )
    parser.add_argument("--small-ops", default=",".join(SMALL_OPS), help=f"comma-separated subset of {SMALL_OPS}")
    parser.add_argument(
        "--decode-cases",
        type=_decode_cases,
        default=DECODE_CASES,
        help="the decode suite's batch x context cases, e.g. 1x512,1x4096 (default: the goal's)",
    )
    parser.add_argument(
        "--decode-window",
        type=int,
        default=None,
        help="the decode suite with a sliding window of this many keys (bandwidth of the bytes inside it)",
    )
    parser.add_argument(
        "--decode-heads",
        type=_decode_heads,
        default=DECODE_HEADS,
        help="the decode suite's Hq,Hkv,D, e.g. 32,8,64 for Llama-3.2-1B (default: 32,8,128, 8B's)",
    )
    return parser.parse_args(argv)


def _decode_cases(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(b), int(n)) for b, n in (case.split("x") for case in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--decode-cases wants BxL[,BxL...], got {text!r}") from None


def _decode_heads(text: str) -> tuple[int, int, int]:
    try:
        heads = tuple(int(n) for n in text.split(","))
    except ValueError:
        heads = ()
    if len(heads) != 3 or min(heads) < 1 or heads[0] % heads[1]:
        raise argparse.ArgumentTypeError(f"--decode-heads wants positive Hq,Hkv,D with Hkv dividing Hq, got {text!r}")
    return heads


def _environment(device) -> dict:
    import torch
    import triton

    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(gpu=props.name, sms=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                    memory_gib=round(props.total_memory / 2**30, 1))  # fmt: skip
    else:
        meta.update(gpu="none (dry run on the CPU interpreter)", sms=0, l2_bytes=0)
    return meta


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A column no row has is left out (the dry run's SDPA math peer, say)."""
    return table(rows, columns, drop_absent=True)


def _markdown(results: dict) -> str:
    meta, ceil = results["meta"], results["ceilings"]
    parts = [
        "# inferq kernel benchmarks",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · python {meta['python']}",
        "",
        "Medians of triton.testing.do_bench (L2 flushed before each call), inputs rotated through copies larger "
        "than twice the L2. Decode and the memory-bound kernels are timed as a CUDA graph of the calls (GPU time "
        "without Python launch overhead, as the engine's graphed decode runs; the torch KV store syncs on the host "
        "and is timed on the stream); prefill and the ceilings per call on the stream. Rows' `*_timing` fields in "
        "kernels.json say which.",
        "",
        "## Ceilings (same run)",
        "",
        f"- device-to-device copy: {ceil['copy_gbps']:.0f} GB/s (bytes read + written)",
        f"- large reduction: {ceil['read_gbps']:.0f} GB/s (bytes read)",
        f"- bf16 matmul {ceil['matmul_n']}^3: {ceil['matmul_tflops']:.0f} TFLOP/s",
    ]
    block = results["meta"].get("pool_block_size", 16)
    if "prefill" in results:
        parts += ["", f"## Prefill attention (causal, paged K/V in blocks of {block} tokens, TFLOP/s)", "",
                  _table(results["prefill"], [
            ("S", "S", ""), ("B", "B", ""), ("inferq_tflops", "inferq", ".0f"),
            ("sdpa_flash_tflops", "SDPA flash", ".0f"), ("sdpa_cudnn_tflops", "SDPA cuDNN", ".0f"),
            ("sdpa_math_tflops", "SDPA math", ".3f"),
            ("inferq_vs_sdpa_flash", "vs flash", ".2f"), ("inferq_vs_sdpa_cudnn", "vs cuDNN", ".2f"),
            ("max_abs_diff_vs_sdpa_flash", "max diff", ".1e"), ("max_abs_diff_vs_sdpa_math", "max diff (math)", ".1e"),
        ])]  # fmt: skip
    if "decode" in results:
        heads = "Hq {}, Hkv {}, D {}, ".format(*results["meta"].get("decode_heads", DECODE_HEADS))
        window = results["meta"].get("decode_window")
        read = "GB/s of K+V read" if window is None else f"window of {window} keys, GB/s of the K+V inside it"
        parts += ["", f"## Decode attention ({heads}paged K/V in blocks of {block} tokens, {read})", "",
                  _table(results["decode"], [
            ("B", "B", ""), ("L", "L", ""), ("window", "window", ""), ("splits", "splits", ""), ("merge", "merge", ""),
            ("inferq_us", "inferq us", ".1f"),
            ("inferq_gbps", "inferq GB/s", ".0f"), ("inferq_frac_read_bw", "of read BW", ".0%"),
            ("other_merge", "other merge", ""), ("other_merge_us", "its us", ".1f"),
            ("sdpa_flash_gbps", "SDPA flash GB/s", ".0f"), ("inferq_vs_sdpa_flash", "vs flash", ".2f"),
            ("max_abs_diff_vs_sdpa_flash", "max diff", ".1e"), ("max_abs_diff_vs_sdpa_math", "max diff (math)", ".1e"),
        ])]  # fmt: skip
    if "small" in results:
        parts += ["", "## Memory-bound kernels (bf16, GB/s, fraction of copy bandwidth)", "", _table(results["small"], [
            ("op", "op", ""), ("T", "T", ""), ("H", "H", ""), ("inferq_us", "inferq us", ".1f"),
            ("inferq_gbps", "inferq GB/s", ".0f"), ("inferq_frac_bw", "of BW", ".0%"),
            ("copy_gbps", "same-size copy GB/s", ".0f"), ("inferq_vs_copy", "vs copy", ".2f"),
            ("eager_gbps", "eager GB/s", ".0f"), ("compile_gbps", "compile GB/s", ".0f"),
            ("inferq_vs_eager", "vs eager", ".2f"), ("inferq_vs_compile", "vs compile", ".2f"),
        ])]  # fmt: skip
    if "sweep_prefill" in results:
        parts += ["", "## Sweep: prefill tiles (TFLOP/s)", "", _table(results["sweep_prefill"], [
            ("S", "S", ""), ("BLOCK_M", "BLOCK_M", ""), ("BLOCK_N", "BLOCK_N", ""), ("num_warps", "warps", ""),
            ("num_stages", "stages", ""), ("tflops", "TFLOP/s", ".0f"), ("max_diff", "max diff", ".1e"),
            ("error", "error", ""),
        ])]  # fmt: skip
    if "sweep_decode" in results:
        parts += ["", "## Sweep: decode tiles, splits and pool layout (GB/s of K+V read)", "",
                  _table(results["sweep_decode"], [
            ("B", "B", ""), ("L", "L", ""), ("layout", "layout", ""), ("BLOCK_N", "BLOCK_N", ""),
            ("num_warps", "warps", ""), ("num_stages", "stages", ""), ("splits", "splits", ""), ("us", "us", ".1f"),
            ("gbps", "GB/s", ".0f"), ("max_diff", "max diff", ".1e"), ("error", "error", ""),
        ])]  # fmt: skip
    if "sweep_small" in results:
        parts += ["", "## Sweep: memory-bound kernels, work per program and warps (bf16)", "",
                  _table(results["sweep_small"], [
            ("op", "op", ""), ("T", "T", ""), ("H", "H", ""), ("BLOCK_R", "rows", ""), ("BLOCK_T", "tokens", ""),
            ("num_warps", "warps", ""), ("us", "us", ".1f"), ("gbps", "GB/s", ".0f"), ("frac_bw", "of BW", ".0%"),
            ("max_diff", "max diff", ".1e"), ("error", "error", ""),
        ])]  # fmt: skip
    errors = [(suite, row) for suite in SUITES for row in results.get(suite, []) if any("error" in k for k in row)]
    if errors:
        parts += ["", "## Errors", ""]
        for suite, row in errors:
            parts.append(f"- {suite}: " + "; ".join(f"{k}: {v}" for k, v in row.items() if "error" in k))
    return "\n".join(parts) + "\n"


def _write(out: Path, results: dict) -> None:
    """JSON and markdown of what is measured so far (after every suite, so a cut-off run keeps its figures)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "kernels.md").write_text(_markdown(results))


def _run_suites(bench, suites: list[str], results: dict, out: Path, block_size: int | None = None,
                small_ops: tuple[str, ...] = SMALL_OPS, decode_cases=DECODE_CASES,
                decode_heads=DECODE_HEADS, decode_window: int | None = None) -> None:  # fmt: skip
    from bench.attention_suites import POOL_BLOCK_SIZE, decode_suite, prefill_suite
    from bench.small_kernel_suite import small_kernel_suite

    tiny = bench.dry_run
    pool = {"block_size": block_size or POOL_BLOCK_SIZE}
    results["meta"]["pool_block_size"] = pool["block_size"]
    if "prefill" in suites:
        if tiny:
            results["prefill"] = prefill_suite(bench, (32,), 64, 4, 1, 64)
        else:
            results["prefill"] = prefill_suite(bench, PREFILL_SEQ_LENS, 16384, 32, 8, 128, **pool)
        print(f"[bench] prefill {results['prefill']}", flush=True)
        _write(out, results)
    if "decode" in suites:
        if tiny:
            decode_cases, decode_heads = ((2, 40),), (4, 1, 64)
        results["meta"]["decode_heads"] = list(decode_heads)
        results["meta"]["decode_window"] = decode_window
        results["decode"] = decode_suite(bench, decode_cases, *decode_heads, **({} if tiny else pool),
                                         window=decode_window)  # fmt: skip
        for row in results["decode"]:
            row["inferq_frac_read_bw"] = row["inferq_gbps"] / results["ceilings"]["read_gbps"]
        print(f"[bench] decode {results['decode']}", flush=True)
        _write(out, results)
    if "small" in suites:
        tokens, hiddens = ((3,), (256,)) if tiny else (SMALL_TOKENS, SMALL_HIDDENS)
        bandwidth = results["ceilings"]["copy_gbps"]
        results["small"] = small_kernel_suite(bench, small_ops, tokens, hiddens, bandwidth_gbps=bandwidth)
        print(f"[bench] small kernels: {len(results['small'])} rows", flush=True)
        _write(out, results)


def _splits_around_a_wave(batch: int, num_kv_heads: int, device) -> list[int]:
    """Split counts around one and two full waves of programs (the second sweep's question)."""
    return [2, 3, 4, 6, 8] if batch > 1 else [16, 24, 33, 48, 64]


def _run_sweeps(bench, results: dict, out: Path) -> None:
    from bench.kernel_sweeps import DECODE_TILES, PREFILL_TILES, sweep_decode, sweep_prefill
    from bench.small_kernel_sweeps import CASES, sweep_small

    if bench.dry_run:
        results["sweep_prefill"] = sweep_prefill(bench, (32,), 64, 4, 1, 64, tile_list=PREFILL_TILES[:2])
        results["sweep_decode"] = sweep_decode(bench, ((2, 40),), 4, 1, 64, tile_list=DECODE_TILES[:2],
                                               layouts=("token_major", "head_major"))  # fmt: skip
        results["sweep_small"] = sweep_small(bench, [(op, 3, 256) for op, _, _ in CASES[:5]], warps=(4,))
    else:
        results["sweep_small"] = sweep_small(bench, bandwidth_gbps=results["ceilings"]["copy_gbps"])
        _write(out, results)
        results["sweep_decode"] = sweep_decode(bench, ((16, 4096), (1, 65536)), tile_list=DECODE_TILES[:4],
                                               splits_for=_splits_around_a_wave,
                                               layouts=("token_major", "head_major"))  # fmt: skip
        _write(out, results)
        results["sweep_prefill"] = sweep_prefill(bench, (1024, 4096, 16384))
    print(f"[bench] sweeps: {len(results['sweep_prefill'])} prefill, {len(results['sweep_decode'])} decode, "
          f"{len(results['sweep_small'])} small rows", flush=True)  # fmt: skip


def main(argv=None) -> dict:
    args = _parse_args(argv)
    suites = [s for s in args.suites.split(",") if s]
    unknown = set(suites) - set(SUITES)
    if unknown:
        raise SystemExit(f"unknown suites {sorted(unknown)}; choose from {SUITES}")
    small_ops = tuple(op for op in args.small_ops.split(",") if op)
    if set(small_ops) - set(SMALL_OPS):
        raise SystemExit(f"unknown small ops {sorted(set(small_ops) - set(SMALL_OPS))}; choose from {SMALL_OPS}")
    if args.dry_run:
        from kernels.interpreter import use_cpu_interpreter

        use_cpu_interpreter()  # before anything imports triton
    import torch

    from bench.kernel_math import check_arithmetic
    from bench.kernel_timing import Bench, measure_ceilings

    check_arithmetic()
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --dry-run for the CPU interpreter")
    device = torch.device("cpu" if args.dry_run else "cuda")
    torch.manual_seed(0)
    meta = _environment(device)
    bench = Bench(device=device, dry_run=args.dry_run, l2_bytes=meta["l2_bytes"])
    print(f"[bench] {meta['gpu']} torch {meta['torch']} triton {meta['triton']}", flush=True)
    out = results_folder(args.out, args.dry_run)
    results: dict = {"meta": meta, "ceilings": measure_ceilings(bench)}
    print(f"[bench] ceilings {results['ceilings']}", flush=True)
    _write(out, results)
    _run_suites(bench, suites, results, out, args.block_size, small_ops, args.decode_cases, args.decode_heads,
                args.decode_window)  # fmt: skip
    if args.sweep:
        _run_sweeps(bench, results, out)
    _write(out, results)
    print(_markdown(results), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
