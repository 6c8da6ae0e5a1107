"""Quantized linear layers (kernels/quant_matmul.py) at the Llama-3.1-8B and Llama-3.2-1B projection shapes,
1..256 tokens, against the bytes and compute floors and against torch in the same run.

For each projection (qkv, o, gate_up, down; random weights) and token count M:
    bytes  = the weight's codes + scales + x [M, K] + y [M, N] (bf16)      floor = bytes / read bandwidth
    flops  = 2 M N K                                                       floor = flops / matmul rate
    floor  = max of the two; "of floor" = floor / measured time
with the read bandwidth and the bf16 matmul rate measured in this run (bench/kernel_timing.py), and the fp8
rate (torch._scaled_mm at 8192^3) for the fp8 formats. Formats: bf16 (F.linear = cuBLAS, and the streaming
kernel up to 64 tokens), int8 per channel, int4 with groups of 128 and zero points, nf4, fp8 with 128x128
block scales and per channel; fp8 times include quantizing x (a kernel of its own). torch's fp8 is
torch._scaled_mm with row-wise scales on x already quantized. Every time is CUDA-graph replays of calls
over weight copies that together exceed the L2 (bench/kernel_timing.py).

    python -m bench.quant_gemm [--out DIR] [--models 8B,1B] [--tokens 1,2,...] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

STEM = "quant_gemm"
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DRY_TOKENS = (1, 3, 70)
FORMATS = ("bf16", "int8", "int4", "nf4", "fp8_block", "fp8_channel")


@dataclass(frozen=True)
class Projection:
    model: str
    name: str
    num_out: int
    num_in: int
    layers: int


def projections(model: str, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, layers: int):
    qkv = (heads + 2 * kv_heads) * head_dim
    return [
        Projection(model, "qkv", qkv, hidden, layers),
        Projection(model, "o", hidden, heads * head_dim, layers),
        Projection(model, "gate_up", 2 * inter, hidden, layers),
        Projection(model, "down", hidden, inter, layers),
    ]


SHAPES = {
    "8B": projections("Llama-3.1-8B", 4096, 32, 8, 128, 14336, 32),
    "1B": projections("Llama-3.2-1B", 2048, 32, 8, 64, 8192, 16),
}
DRY_SHAPES = {"tiny": projections("tiny", 128, 4, 2, 32, 256, 2)}


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    parser.add_argument("--models", default="8B,1B", help="comma-separated: 8B, 1B")
    parser.add_argument("--tokens", default="", help="comma-separated token counts (default: 1..256)")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {FORMATS}")
    return parser.parse_args(argv)


def weight_for(fmt: str, proj: Projection, device: torch.device) -> dict:
    from kernels.quant_formats import random_quantized_weight

    if fmt == "bf16":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        w = torch.randn(proj.num_out, proj.num_in, device=device) * proj.num_in**-0.5
        return {"weight": w.to(dtype)}
    if fmt == "int8":
        return random_quantized_weight("int8", proj.num_out, proj.num_in, None, device)
    if fmt == "int4":
        return random_quantized_weight("int4", proj.num_out, proj.num_in, 128, device, zeros=True)
    return random_quantized_weight(fmt, proj.num_out, proj.num_in, None, device)


def weight_bytes(weight: dict) -> int:
    return sum(t.numel() * t.element_size() for t in weight.values() if isinstance(t, torch.Tensor))


def matmul_for(fmt: str):
    from kernels import quant_matmul as qm

    return {"bf16": qm.dense_matmul, "int8": qm.int8_matmul, "int4": qm.int4_matmul, "nf4": qm.nf4_matmul,
            "fp8_block": qm.fp8_matmul, "fp8_channel": qm.fp8_matmul}[fmt]  # fmt: skip


def fp8_tflops(bench) -> float | None:
    """torch._scaled_mm's rate at 8192^3 (row-wise scales), or None where there is no fp8 GEMM."""
    if bench.dry_run:
        return None
    n = 8192
    a = torch.randn(n, n, device=bench.device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=bench.device).to(torch.float8_e4m3fn)
    sa, sb = torch.ones(n, 1, device=bench.device), torch.ones(1, n, device=bench.device)
    try:
        ms = bench.time_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), [()])
    except RuntimeError:
        return None
    return 2 * n**3 / ms / 1e9


def measure_projection(bench, proj: Projection, tokens, formats, ceilings: dict) -> list[dict]:
    rows = []
    dtype = torch.bfloat16 if bench.device.type == "cuda" else torch.float32
    for fmt in formats:
        weight = weight_for(fmt, proj, bench.device)
        nbytes_w = weight_bytes(weight)
        copies = [weight] + [
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in weight.items()}
            for _ in range(bench.rotations(nbytes_w) - 1)
        ]
        matmul = matmul_for(fmt)
        rate = ceilings["fp8_tflops"] if fmt.startswith("fp8") and ceilings.get("fp8_tflops") else None
        rate = rate or ceilings["matmul_tflops"]
        for num_tokens in tokens:
            x = torch.randn(num_tokens, proj.num_in, device=bench.device).to(dtype)
            inputs = [(x, w) for w in copies]
            # progress before each case: a device fault is reported late, at a later sync
            print(f"{proj.model} {proj.name} {fmt} {num_tokens} tokens", flush=True)
            ms, how = bench.measure(lambda x, w, matmul=matmul: matmul(x, **w), inputs, True)
            nbytes = nbytes_w + (num_tokens * proj.num_in + num_tokens * proj.num_out) * x.element_size()
            flops = 2 * num_tokens * proj.num_out * proj.num_in
            bytes_ms = nbytes / ceilings["read_gbps"] / 1e6
            flops_ms = flops / rate / 1e9
            row = {"model": proj.model, "proj": proj.name, "N": proj.num_out, "K": proj.num_in, "layers": proj.layers,
                   "format": fmt,
                   "tokens": num_tokens, "us": ms * 1e3, "timing": how, "weight_bytes": nbytes_w,
                   "floor_us": max(bytes_ms, flops_ms) * 1e3, "bound": "bytes" if bytes_ms >= flops_ms else "flops",
                   "frac_of_floor": max(bytes_ms, flops_ms) / ms, "read_gbps": nbytes / ms / 1e6}  # fmt: skip
            row.update(_torch_baseline(bench, fmt, weight, copies, x))
            rows.append(row)
        del copies, weight
        bench.free()
    return rows


def _torch_baseline(bench, fmt: str, weight: dict, copies: list, x: torch.Tensor) -> dict:
    """bf16: F.linear (cuBLAS); fp8 per channel: torch._scaled_mm on x quantized beforehand (GPU only)."""
    if fmt == "bf16":
        ms, _ = bench.measure(lambda x, w: F.linear(x, w["weight"]), [(x, w) for w in copies], True)
        return {"torch": "F.linear", "torch_us": ms * 1e3}
    if fmt != "fp8_channel" or bench.dry_run:
        return {}
    from kernels.fp8_activations import quantize_fp8_activations

    xq, xs = quantize_fp8_activations(x)
    scale_b = weight["weight_scale"].reshape(1, -1)

    def scaled_mm(w):
        return torch._scaled_mm(xq, w["qweight"].t(), scale_a=xs, scale_b=scale_b, out_dtype=torch.bfloat16)

    try:
        ms, _ = bench.measure(scaled_mm, [(w,) for w in copies], True)
    except RuntimeError as e:  # shapes cuBLASLt's fp8 GEMM refuses
        return {"torch": "torch._scaled_mm", "torch_error": str(e).splitlines()[0][:200]}
    return {"torch": "torch._scaled_mm", "torch_us": ms * 1e3}


def markdown(results: dict) -> str:
    env, ceil = results["environment"], results["ceilings"]
    fp8 = f"{ceil['fp8_tflops']:.0f}" if ceil.get("fp8_tflops") else "-"
    lines = [f"# Quantized linear layers ({env.get('gpu', '?')}, read {ceil['read_gbps']:.0f} GB/s, bf16 matmul "
             f"{ceil['matmul_tflops']:.0f} TFLOP/s, fp8 {fp8} TFLOP/s, measured in this run)", "",
             "Each cell: us (share of the floor: max(bytes / read BW, FLOPs / matmul rate)). bf16 = the streaming "
             "kernel up to 64 tokens, cuBLAS above; torch bf16 = F.linear; torch fp8 = torch._scaled_mm (row-wise "
             "scales, x quantized beforehand). fp8 includes quantizing x.", ""]  # fmt: skip
    rows = results["rows"]
    formats = [f for f in FORMATS if any(r["format"] == f for r in rows)]
    for model in dict.fromkeys(r["model"] for r in rows):
        for proj in dict.fromkeys(r["proj"] for r in rows if r["model"] == model):
            sel = [r for r in rows if r["model"] == model and r["proj"] == proj]
            lines += [f"## {model} {proj} [N={sel[0]['N']}, K={sel[0]['K']}]", "",
                      "| M | torch bf16 | " + " | ".join(formats) + " | torch fp8 |",
                      "|---" * (len(formats) + 3) + "|"]  # fmt: skip
            for num_tokens in dict.fromkeys(r["tokens"] for r in sel):
                cells = {r["format"]: r for r in sel if r["tokens"] == num_tokens}
                torch_bf16 = cells.get("bf16", {}).get("torch_us")
                torch_fp8 = cells.get("fp8_channel", {}).get("torch_us")
                line = [str(num_tokens), f"{torch_bf16:.1f}" if torch_bf16 else "-"]
                line += [
                    f"{cells[f]['us']:.1f} ({cells[f]['frac_of_floor']:.0%})" if f in cells else "-" for f in formats
                ]
                line.append(f"{torch_fp8:.1f}" if torch_fp8 else "-")
                lines.append("| " + " | ".join(line) + " |")
            lines.append("")
    lines += ["## Every layer's projections at one token (ms per token, LM head and attention left out)", "",
              "| model | " + " | ".join(formats) + " | torch bf16 |", "|---" * (len(formats) + 2) + "|"]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in rows):
        one = [r for r in rows if r["model"] == model and r["tokens"] == 1]
        cells = []
        for f in formats:
            sel = [r for r in one if r["format"] == f]
            cells.append(f"{sum(r['us'] * r['layers'] for r in sel) / 1e3:.2f}" if sel else "-")
        torch_sel = [r for r in one if r["format"] == "bf16" and "torch_us" in r]
        torch_ms = sum(r["torch_us"] * r["layers"] for r in torch_sel) / 1e3
        cells.append(f"{torch_ms:.2f}" if torch_sel else "-")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = _parse_args(argv)
    from bench.engine_common import environment, write_results
    from bench.kernel_timing import Bench, measure_ceilings

    bench = Bench.for_run(args.dry_run)
    device = bench.device
    formats = [f for f in args.formats.split(",") if f]
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise SystemExit(f"--formats: unknown {sorted(unknown)}; known: {FORMATS}")
    if args.dry_run:
        shapes = DRY_SHAPES["tiny"]
    else:
        wanted = [m for m in args.models.split(",") if m]
        if set(wanted) - set(SHAPES):
            raise SystemExit(f"--models: unknown {sorted(set(wanted) - set(SHAPES))}; known: {sorted(SHAPES)}")
        shapes = [p for m in wanted for p in SHAPES[m]]
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else (DRY_TOKENS if args.dry_run else TOKENS)
    ceilings = measure_ceilings(bench)
    ceilings["fp8_tflops"] = fp8_tflops(bench)
    results = {"environment": environment(device), "ceilings": ceilings,
               "shapes": [asdict(p) for p in shapes], "rows": []}  # fmt: skip
    out = Path(args.out)
    for proj in shapes:
        results["rows"] += measure_projection(bench, proj, tokens, formats, ceilings)
        write_results(out, STEM, results, markdown(results))
        print(f"{proj.model} {proj.name} done", flush=True)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
