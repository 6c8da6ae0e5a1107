"""The sweep behind kernels/rms_norm_gemv.py's tiles, and what the fusion saves per layer: at the
Llama-3.1-8B and 3.2-1B shapes, one token, bf16,
  - unfused (what the engine ran before): the fused residual-add + RMSNorm kernel, the projection
    (kernels/gemv.py for 8B-sized weights, F.linear otherwise, as engine.ops dispatched it) and, for
    gate|up, the SiLU-and-mul kernel;
  - the same with the projection always on kernels/gemv.py;
  - fused: kernels/rms_norm_gemv.py at its default tiles and over (BLOCK_N, BLOCK_K, num_warps, stages),
    SwiGLU inside it or as the SiLU-and-mul kernel after it;
  - kernels/gemv.py alone (no norm, no SwiGLU): what the weight stream costs in this kernel family.
Each is timed as a CUDA graph of 20 calls (GPU time without launch gaps of the host, as the engine's
decode graph runs), the weights rotated through copies larger than the L2; fractions are of the read
bandwidth measured in the same run, counting the weight bytes only.

    python -m bench.fused_gemv_sweep     # on a CUDA GPU; writes fused_gemv_sweep.{json,md} into $OUT
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.gemv_sweep import L2_BYTES, _graph_us, _rotating

# name: (N weight rows, K, SwiGLU: None (a plain projection), "fused" (in the kernel) or "separate" (the
# norm fused, SiLU-and-mul its own kernel after it, as engine.ops does above SWIGLU_GEMV_MAX_FEATURES))
SHAPES = {
    "8B qkv": (6144, 4096, None), "1B qkv": (3072, 2048, None),
    "8B gate_up": (28672, 4096, "fused"), "8B gate_up, SwiGLU apart": (28672, 4096, "separate"),
    "1B gate_up": (16384, 2048, "fused"), "1B gate_up, SwiGLU apart": (16384, 2048, "separate"),
}  # fmt: skip
CONFIGS = list(itertools.product((1, 2, 4, 8), (512,), (4, 8), (2, 3, 4)))  # (BLOCK_N, BLOCK_K, num_warps, stages)
EPS = 1e-5


def _unfused(x, res, g, w, swiglu: bool, projection):
    from kernels.rms_norm import fused_add_rms_norm
    from kernels.silu_and_mul import silu_and_mul

    normed, _ = fused_add_rms_norm(x, res, g, EPS)
    y = projection(normed, w)
    return silu_and_mul(y) if swiglu else y


def _fused(x, res, g, w, swiglu: str | None, tiles: dict):
    from kernels.rms_norm_gemv import rms_norm_gemv
    from kernels.silu_and_mul import silu_and_mul

    y, _ = rms_norm_gemv(x, res, g, EPS, w, swiglu=swiglu == "fused", tiles=tiles)
    return silu_and_mul(y) if swiglu == "separate" else y


def _sweep_shape(num_out: int, num_in: int, swiglu: str | None, read_bw: float) -> dict:
    from kernels.gemv import gemv

    copies = max(2, int(L2_BYTES // (num_out * num_in * 2)) + 1)
    weights = [torch.randn(num_out, num_in, device="cuda", dtype=torch.bfloat16) / num_in**0.5 for _ in range(copies)]
    x, res = (torch.randn(1, num_in, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    g = torch.rand(num_in, device="cuda", dtype=torch.bfloat16) + 0.5
    engine_projection = gemv if min(num_out, num_in) >= 4096 else F.linear  # engine.ops before the fusion
    act = swiglu is not None
    row = {"N": num_out, "K": num_in, "swiglu": swiglu}
    row["gemv_alone_us"] = _graph_us(_rotating(weights, lambda w: gemv(x, w)))  # the projection, nothing else
    row["unfused_us"] = _graph_us(_rotating(weights, lambda w: _unfused(x, res, g, w, act, engine_projection)))
    row["unfused_gemv_us"] = _graph_us(_rotating(weights, lambda w: _unfused(x, res, g, w, act, gemv)))
    reference = _unfused(x.float(), res.float(), g.float(), weights[0].float(), act, F.linear)
    scale = reference.abs().max().item()
    best = None
    for block_n, block_k, warps, stages in CONFIGS:
        tiles = {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps, "num_stages": stages}
        try:
            if (_fused(x, res, g, weights[0], swiglu, tiles).float() - reference).abs().max().item() > 0.05 * scale:
                print(f"  {tiles}: wrong result, skipped", flush=True)
                continue
            us = _graph_us(_rotating(weights, lambda w, t=tiles: _fused(x, res, g, w, swiglu, t)))
        except Exception as exc:  # a tile that does not compile or fit is not a candidate
            print(f"  {tiles}: {type(exc).__name__}", flush=True)
            continue
        row.setdefault("fused_us_by_config", {})[str((block_n, block_k, warps, stages))] = us
        if best is None or us < best[0]:
            best = (us, (block_n, block_k, warps, stages))
    row["fused_us"], row["fused_config"] = best
    row["fused_default_us"] = _graph_us(_rotating(weights, lambda w: _fused(x, res, g, w, swiglu, {})))
    gigabytes = num_out * num_in * 2 / 1e9
    for key in ("gemv_alone_us", "unfused_us", "unfused_gemv_us", "fused_us", "fused_default_us"):
        row[key.replace("_us", "_frac")] = gigabytes / (row[key] * 1e-6) / read_bw
    return row


def _markdown(result: dict) -> str:
    lines = [
        "# One-token norm + projection (+ SwiGLU): unfused vs kernels/rms_norm_gemv.py",
        "",
        f"{result['meta']} · read bandwidth {result['read_bw_gbs']:.0f} GB/s (large sum, same run)",
        "",
        "us per call (weight bytes over read bandwidth in brackets). 'GEMV alone': kernels/gemv.py without the "
        "norm or the SwiGLU, the bytes' lower bound for this kernel family.",
        "",
        "| shape | N x K | GEMV alone | unfused (engine before) | unfused, GEMV | fused, default tiles | "
        "fused, best tiles | best (BLOCK_N, BLOCK_K, warps, stages) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda r, key: f"{r[key + '_us']:.1f} ({r[key + '_frac']:.0%})"  # noqa: E731
    for name, r in result["shapes"].items():
        lines.append(
            f"| {name} | {r['N']} x {r['K']} | {fmt(r, 'gemv_alone')} | {fmt(r, 'unfused')} | "
            f"{fmt(r, 'unfused_gemv')} | {fmt(r, 'fused_default')} | {fmt(r, 'fused')} | {r['fused_config']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    import triton

    torch.manual_seed(0)
    big = torch.empty(1024**3, dtype=torch.bfloat16, device="cuda").normal_()
    read_bw = big.numel() * 2 / (_graph_us(big.sum) * 1e-6) / 1e9
    del big
    meta = f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}"
    configs = "(BLOCK_N, BLOCK_K, num_warps, num_stages)"
    result: dict = {"meta": meta, "read_bw_gbs": read_bw, "configs": configs, "shapes": {}}
    for name, (num_out, num_in, swiglu) in SHAPES.items():
        row = result["shapes"][name] = _sweep_shape(num_out, num_in, swiglu, read_bw)
        print(f"{name:26s} gemv {row['gemv_alone_us']:6.1f} us  unfused {row['unfused_us']:6.1f} us  "
              f"fused {row['fused_default_us']:6.1f} us, best {row['fused_us']:6.1f} us {row['fused_config']}",
              flush=True)  # fmt: skip
    out = Path(os.environ.get("OUT", "bench/results/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "fused_gemv_sweep.json").write_text(json.dumps(result, indent=1))
    (out / "fused_gemv_sweep.md").write_text(_markdown(result))
    print(_markdown(result), flush=True)


if __name__ == "__main__":
    main()
