"""The MoE layer's kernels against torch and against their floor (BENCHMARKS.md, "MoE layer").

    python -m bench.moe_layer                 # on a CUDA GPU, from the repo root
    python -m bench.moe_layer --dry-run       # CPU (Triton interpreter): tiny shapes, code paths only

1. Router: kernels/moe_router.py against torch's softmax + topk + renormalize, 1..8192 tokens; and the
   gate's projection at one token (the E x H router weight), kernels/gemv.py (what the engine runs) against
   F.linear (cuBLAS).
2. The routed experts from the router's logits (route, then kernels/fused_moe.py: what vLLM's
   fused_moe times), random bf16 weights of real shapes, random logits (about uniform routing), at
   1..8192 tokens, against the torch reference (kernels/fused_moe.py's fused_experts_ref, expert by
   expert) and the floor: the bytes of the experts the routing touched (each once) over the measured
   read bandwidth, and the FLOPs (2 * T * K * 3 * H * I) over the measured bf16 matmul rate; the
   figure that binds is reported as its fraction (bytes at 1-64 tokens, TFLOP/s at >= 2048).
3. Mixtral-8x7B's experts as vLLM names them (E=8, N=7168, K=4096, top-2: a TP=2 shard, I = 7168) at
   1, 32 and 1536 tokens beside vLLM's published tuned Triton fused MoE: 144 / 487 / 1,123 us.
Kernel times are CUDA-graph replays (bench/kernel_timing.py); the torch reference, which reads the
routing on the host, on the stream. Writes moe_layer.{json,md} into $OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

STEM = "moe_layer"
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 4096, 8192)
ROUTER_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 8192)
BYTES_BOUND_MAX_TOKENS, FLOPS_BOUND_MIN_TOKENS = 64, 2048
VLLM_MIXTRAL_US = {1: 144.0, 32: 487.0, 1536: 1123.0}  # vLLM's tuned fused MoE, H100, E=8 N=7168 K=4096 top-2


@dataclass(frozen=True)
class MoEShape:
    """One layer's routed experts: E experts of intermediate size I over hidden size H, top-K."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    inter: int
    renormalize: bool

    @property
    def expert_bytes(self) -> int:
        return 3 * self.hidden * self.inter * 2  # gate, up and down, bf16


SHAPES = (
    MoEShape("Mixtral-8x7B TP2 (vLLM E=8 N=7168)", 8, 2, 4096, 7168, True),
    MoEShape("Mixtral-8x7B", 8, 2, 4096, 14336, True),
    MoEShape("Qwen3-30B-A3B", 128, 8, 2048, 768, True),
    MoEShape("Qwen1.5-MoE-A2.7B", 60, 4, 2048, 1408, False),
    MoEShape("OLMoE-1B-7B", 64, 8, 2048, 1024, False),
)
DRY_SHAPES = (MoEShape("tiny", 5, 2, 64, 32, True), MoEShape("tiny top-4", 9, 4, 48, 24, False))
DRY_TOKENS = (1, 3, 40)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--tokens", default="", help="comma-separated token counts (default: 1..8192)")
    parser.add_argument("--skip-reference", action="store_true", help="leave out the torch reference")
    return parser.parse_args(argv)


def touched_experts(ids: torch.Tensor) -> int:
    return int(torch.unique(ids).numel())


def layer_inputs(shape: MoEShape, num_tokens: int, device: torch.device, seed: int = 0):
    """x [T, H] bf16 at unit scale, router logits [T, E] (random: about uniform routing), w13, w2 at unit
    output scale (float32 on the interpreter, whose bf16 dots are slow)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=generator, device=device) * scale).to(dtype)

    x = randn(num_tokens, shape.hidden)
    logits = randn(num_tokens, shape.num_experts)
    w13 = randn(shape.num_experts, 2 * shape.inter, shape.hidden, scale=shape.hidden**-0.5)
    w2 = randn(shape.num_experts, shape.hidden, shape.inter, scale=shape.inter**-0.5)
    return x, logits, w13, w2


def measure_router(bench, tokens: tuple[int, ...], shapes: tuple[MoEShape, ...]) -> list[dict]:
    from kernels.moe_router import moe_route, moe_route_ref

    rows = []
    for shape in {(s.num_experts, s.top_k, s.renormalize): s for s in shapes}.values():
        for num_tokens in tokens:
            _, logits, _, _ = layer_inputs(shape, num_tokens, bench.device)
            args = [(logits, shape.top_k, shape.renormalize)]
            kernel_ms, how = bench.measure(moe_route, args, True)
            torch_ms, torch_how = bench.measure(moe_route_ref, args, True)
            rows.append({"experts": shape.num_experts, "top_k": shape.top_k, "tokens": num_tokens,
                         "kernel_us": kernel_ms * 1e3, "torch_us": torch_ms * 1e3, "speedup": torch_ms / kernel_ms,
                         "timing": how, "torch_timing": torch_how})  # fmt: skip
    return rows


def measure_gate(bench, shapes: tuple[MoEShape, ...]) -> list[dict]:
    """The router's gate projection at one token: kernels/gemv.py against F.linear."""
    import torch.nn.functional as F

    from kernels.gemv import gemv

    rows = []
    for shape in {(s.num_experts, s.hidden): s for s in shapes}.values():
        x, _, _, _ = layer_inputs(shape, 1, bench.device)
        weight = torch.randn(shape.num_experts, shape.hidden, device=bench.device).to(x.dtype)
        args = [(x, weight)]
        kernel_ms, how = bench.measure(gemv, args, True)
        torch_ms, _ = bench.measure(F.linear, args, True)
        rows.append({"experts": shape.num_experts, "hidden": shape.hidden, "gemv_us": kernel_ms * 1e3,
                     "cublas_us": torch_ms * 1e3, "timing": how})  # fmt: skip
    return rows


def measure_layer(bench, shape: MoEShape, tokens: tuple[int, ...], ceilings: dict, skip_reference: bool) -> list[dict]:
    from kernels.fused_moe import fused_experts, fused_experts_ref
    from kernels.moe_router import moe_route
    from kernels.moe_tiles import moe_tiles

    rows = []
    for num_tokens in tokens:
        x, logits, w13, w2 = layer_inputs(shape, num_tokens, bench.device, seed=num_tokens)

        def layer(x, logits, w13, w2, top_k, renormalize):
            return fused_experts(x, w13, w2, *moe_route(logits, top_k, renormalize))

        def reference(x, logits, w13, w2, top_k, renormalize):
            return fused_experts_ref(x, w13, w2, *moe_route(logits, top_k, renormalize))

        inputs = [(x, logits, w13, w2, shape.top_k, shape.renormalize)]
        ms, how = bench.measure(layer, inputs, True)
        weights, ids = moe_route(logits, shape.top_k, shape.renormalize)
        touched = touched_experts(ids)
        nbytes = touched * shape.expert_bytes + 2 * x.numel() * x.element_size()  # the experts read, x in, y out
        flops = 2 * num_tokens * shape.top_k * 3 * shape.hidden * shape.inter
        floor_ms = max(nbytes / ceilings["read_gbps"] / 1e6, flops / ceilings["matmul_tflops"] / 1e9)
        row = {"shape": shape.name, "tokens": num_tokens, "us": ms * 1e3, "timing": how,
               "path": moe_tiles(num_tokens, shape.num_experts, shape.top_k, shape.hidden, shape.inter, x.dtype,
                                 x.device)["path"],
               "experts_touched": touched, "floor_us": floor_ms * 1e3, "frac_of_floor": floor_ms / ms,
               "read_gbps": nbytes / ms / 1e6, "frac_read_bw": nbytes / ms / 1e6 / ceilings["read_gbps"],
               "tflops": flops / ms / 1e9, "frac_matmul": flops / ms / 1e9 / ceilings["matmul_tflops"]}  # fmt: skip
        if not skip_reference:
            ref_ms, _ = bench.measure(reference, inputs, False)
            row.update(torch_us=ref_ms * 1e3, speedup_vs_torch=ref_ms / ms)
        if shape.name.startswith("Mixtral-8x7B TP2") and num_tokens in VLLM_MIXTRAL_US:
            row.update(vllm_us=VLLM_MIXTRAL_US[num_tokens], vs_vllm=VLLM_MIXTRAL_US[num_tokens] / row["us"])
        rows.append(row)
        del x, logits, w13, w2, inputs
        bench.free()
    return rows


def markdown(results: dict) -> str:
    env, ceil = results["environment"], results["ceilings"]
    lines = [f"# MoE layer ({env.get('gpu', '?')}, read {ceil['read_gbps']:.0f} GB/s, bf16 matmul "
             f"{ceil['matmul_tflops']:.0f} TFLOP/s, measured in this run)", "",
             "## Router: softmax + top-k + renormalize from logits", "",
             "| E | top-k | tokens | kernel us | torch us | speedup |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["router"]:
        lines.append(f"| {r['experts']} | {r['top_k']} | {r['tokens']} | {r['kernel_us']:.1f} | "
                     f"{r['torch_us']:.1f} | {r['speedup']:.1f}x |")  # fmt: skip
    lines += ["", "## The router's gate projection at one token (E x H weight)", "",
              "| E | H | kernels/gemv.py us | F.linear us |", "|---|---|---|---|"]  # fmt: skip
    for r in results.get("gate", []):
        lines.append(f"| {r['experts']} | {r['hidden']} | {r['gemv_us']:.1f} | {r['cublas_us']:.1f} |")
    lines += ["", "## Routed experts from the router's logits (route + fused experts)", "",
              f"Floor: experts touched x their bytes / read BW, or FLOPs / matmul rate; bytes bind at <= "
              f"{BYTES_BOUND_MAX_TOKENS} tokens (goal >= 85% of read BW), FLOPs at >= {FLOPS_BOUND_MIN_TOKENS} "
              "(goal >= 500 TFLOP/s). vLLM: its published tuned Triton fused MoE on an H100.", "",
              "| shape | tokens | path | us | floor us | of floor | experts | of read BW | TFLOP/s | torch us | "
              "vs torch | vLLM us | vs vLLM |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["layer"]:
        torch_us = f"{r['torch_us']:.1f}" if "torch_us" in r else "-"
        vs_torch = f"{r['speedup_vs_torch']:.1f}x" if "speedup_vs_torch" in r else "-"
        vllm = (f"{r['vllm_us']:.0f}", f"{r['vs_vllm']:.2f}x") if "vllm_us" in r else ("-", "-")
        lines.append(f"| {r['shape']} | {r['tokens']} | {r['path']} | {r['us']:.1f} | {r['floor_us']:.1f} | "
                     f"{r['frac_of_floor']:.0%} | {r['experts_touched']} | {r['frac_read_bw']:.0%} | "
                     f"{r['tflops']:.0f} | {torch_us} | {vs_torch} | {vllm[0]} | {vllm[1]} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = _parse_args(argv)
    from bench.engine_common import environment, write_results
    from bench.kernel_timing import Bench, measure_ceilings

    bench = Bench.for_run(args.dry_run)
    device = bench.device
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    if args.shapes:
        wanted = set(args.shapes.split(","))
        shapes = tuple(s for s in shapes if s.name in wanted)
        if not shapes:
            raise SystemExit(f"no shape named {sorted(wanted)}; known: {[s.name for s in SHAPES]}")
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else (DRY_TOKENS if args.dry_run else TOKENS)
    results = {"environment": environment(device), "ceilings": measure_ceilings(bench),
               "shapes": [asdict(s) for s in shapes], "router": [], "layer": []}  # fmt: skip
    results["router"] = measure_router(bench, DRY_TOKENS if args.dry_run else ROUTER_TOKENS, shapes)
    results["gate"] = measure_gate(bench, shapes)
    out = Path(args.out)
    write_results(out, STEM, results, markdown(results))
    for shape in shapes:
        results["layer"] += measure_layer(bench, shape, tokens, results["ceilings"], args.skip_reference)
        write_results(out, STEM, results, markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
