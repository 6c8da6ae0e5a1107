"""Trial for batch-1 decode: the post-attention residual add + RMSNorm prepared by the o_proj GEMV's
epilogue, instead of recomputed by every program of the gate|up projection. One run times both chains:

    base:    kernels/gemv.py (o_proj) -> kernels/rms_norm_gemv.py (residual add, RMSNorm, gate|up[, SwiGLU])
    trial:   _producer_kernel         -> _consumer_kernel
    unfused: kernels/gemv.py -> kernels/rms_norm.py (add + RMSNorm) -> kernels/gemv.py -> SiLU-and-mul
             (the engine with its fused norms off, whose GEMV has had a faster load schedule since session 14)

    python -m bench.norm_epilogue_trials --out DIR     # GPU
    python -m bench.norm_epilogue_trials --dry-run     # CPU interpreter, tiny shapes, correctness only

Why: in the fused norm + GEMV each of the gate|up kernel's programs (2048 of them at Llama-3.2-1B)
loads x, the residual and the norm weight for every chunk of K and adds, squares and scales them,
next to the weight stream that is the whole point. The 1B step's fused gate|up takes 26.2 us a layer
against 23.6-24.0 us for the plain GEMV of the same weight (H100, sessions 14 and 16): 35-42 us of a
1.057 ms step, where the goal is 1.0. The fused qkv + RoPE kernel carries the same prologue.

The trial moves that work to where it is done once per row:
- producer (o_proj, program p owns rows R_p): y = a W_o^T rounded as F.linear rounds; h = y + residual,
  rounded (the new residual stream, stored); hg = h * g in fp32 (stored); part[p] = sum over R_p of h^2;
- consumer (gate|up): the plain GEMV's loop over hg, then rstd = rsqrt(sum_p part[p] / K + eps) from the
  parts in a fixed order (deterministic: no atomics), y = rstd * acc, SwiGLU where the engine fuses it.
Both are checked against the fp32 reference, and timed as a CUDA graph of 20 chains over weights
rotated past the L2, with PDL (as in the engine's decode graph).

Measured (H100, session 17, bench/results/h100/decode_merge_session17/call1_norm_epilogue_trials/): us a
chain, base / trial / unfused, 1B 29.9 / 29.4 / 31.0, 8B 92.9 / 92.1 / 92.9. The trial saves 0.5 us a
layer at 1B (about 16 us a step if the qkv kernel gained as much), not the 35-42 us the prologue seemed
to cost; it was not built into the engine.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and "--dry-run" in sys.argv:  # before triton is imported (kernels/interpreter.py)
    from kernels.interpreter import use_cpu_interpreter

    use_cpu_interpreter()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.gemv_sweep import L2_BYTES, _graph_us, trial_arguments, trial_device, write_trials  # noqa: E402
from bench.report import table  # noqa: E402
from kernels._launch import num_sms  # noqa: E402
from kernels._pdl import pdl_launch_dependents, pdl_wait  # noqa: E402
from kernels.gemv import gemv, gemv_rows, gemv_tiles, weight_chunk  # noqa: E402
from kernels.rms_norm import fused_add_rms_norm  # noqa: E402
from kernels.rms_norm_gemv import rms_norm_gemv  # noqa: E402
from kernels.silu_and_mul import silu_and_mul  # noqa: E402

EPS = 1e-5
# name: (hidden K, attention width, intermediate I, SwiGLU inside the gate|up kernel as the engine runs it)
SHAPES = {"1B": (2048, 2048, 8192, True), "8B": (4096, 4096, 14336, False)}
CONSUMER_ROWS, CONSUMER_BLOCK_K, CONSUMER_WARPS = 8, 512, 4  # kernels/rms_norm_gemv.py's SwiGLU tile


@triton.jit
def _producer_kernel(a_ptr, w_ptr, res_ptr, g_ptr, new_res_ptr, hg_ptr, part_ptr, N, K, stride_wn,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
                     PDL: tl.constexpr):  # fmt: skip
    """kernels/gemv.py's loop and load schedule (gemv_tiles) with the residual + norm-prep epilogue."""
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    w = weight_chunk(w_rows, n_mask, 0, K, BLOCK_K)  # before the wait: weights only (kernels/_pdl.py)
    pdl_wait(PDL)
    y = gemv_rows(w, a_ptr, w_rows, n, n_mask, K, BLOCK_N, BLOCK_K, PREFETCH)
    y = y.to(a_ptr.dtype.element_ty).to(tl.float32)  # rounded as F.linear rounds
    h = (y + tl.load(res_ptr + n, mask=n_mask, other=0.0).to(tl.float32)).to(new_res_ptr.dtype.element_ty)
    tl.store(new_res_ptr + n, h, mask=n_mask)
    h = tl.where(n_mask, h.to(tl.float32), 0.0)
    tl.store(hg_ptr + n, h * tl.load(g_ptr + n, mask=n_mask, other=0.0).to(tl.float32), mask=n_mask)
    tl.store(part_ptr + pid, tl.sum(h * h, axis=0))


@triton.jit
def _consumer_kernel(hg_ptr, part_ptr, w_ptr, y_ptr, num_rows, K, num_parts, stride_wn, eps,
                     SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_PARTS: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """The plain GEMV's loop over the prepared input, scaled by the norm's rstd at the end."""
    pdl_launch_dependents(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < num_rows
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    up_rows = w_ptr + (n[:, None] + num_rows).to(tl.int64) * stride_wn
    w = weight_chunk(w_rows, n_mask, 0, K, BLOCK_K)  # before the wait: weights only
    if SWIGLU:
        w_up = weight_chunk(up_rows, n_mask, 0, K, BLOCK_K)
    pdl_wait(PDL)
    p = tl.arange(0, BLOCK_PARTS)
    parts = tl.load(part_ptr + p, mask=p < num_parts, other=0.0)  # in flight during the loop
    # kernels/rms_norm_gemv.py's loop, load for load, without its norm prologue: the first chunk from before
    # the wait, then each chunk's weights loaded at the top of its step; the input as one [BLOCK_K] row
    # broadcast, as it reads its normed chunk (a broadcast tile in the weight's layout measured slower there)
    k = tl.arange(0, BLOCK_K)
    hg = tl.load(hg_ptr + k, mask=k < K, other=0.0)[None, :]
    acc = w.to(tl.float32) * hg
    if SWIGLU:
        acc_up = w_up.to(tl.float32) * hg
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        hg = tl.load(hg_ptr + k, mask=k < K, other=0.0)[None, :]
        w = weight_chunk(w_rows, n_mask, k0, K, BLOCK_K)
        acc += w.to(tl.float32) * hg
        if SWIGLU:
            w_up = weight_chunk(up_rows, n_mask, k0, K, BLOCK_K)
            acc_up += w_up.to(tl.float32) * hg
    rstd = tl.rsqrt(tl.sum(parts, axis=0) / K + eps)
    y = tl.sum(acc, axis=1) * rstd
    if SWIGLU:
        y = (y / (1.0 + tl.exp(-y))) * (tl.sum(acc_up, axis=1) * rstd)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def trial_chain(a, w_o, residual, norm_weight, w_gate_up, swiglu: bool, pdl: bool, schedule: dict | None = None):
    """(out, new residual) of the trial: producer, then consumer (then SiLU-and-mul where not fused).
    schedule: the producer's BLOCK_K and PREFETCH over kernels/gemv.py's tile for the o_proj's size."""
    hidden = w_o.shape[0]
    tile = {**gemv_tiles(hidden, num_sms(a.device)), **(schedule or {})}  # the engine's o_proj tile at this size
    rows, warps = tile.pop("BLOCK_N"), tile.pop("num_warps")
    num_parts = triton.cdiv(hidden, rows)
    new_res = torch.empty_like(residual)
    hg = torch.empty(1, hidden, device=a.device, dtype=torch.float32)
    parts = torch.empty(num_parts, device=a.device, dtype=torch.float32)
    _producer_kernel[(num_parts,)](a, w_o, residual, norm_weight, new_res, hg, parts, hidden, w_o.shape[1],
                                   w_o.stride(0), BLOCK_N=rows, **tile, PDL=pdl, launch_pdl=pdl,
                                   num_warps=warps)  # fmt: skip
    num_rows = w_gate_up.shape[0] // 2 if swiglu else w_gate_up.shape[0]
    y = torch.empty(1, num_rows, device=a.device, dtype=a.dtype)
    _consumer_kernel[(triton.cdiv(num_rows, CONSUMER_ROWS),)](
        hg, parts, w_gate_up, y, num_rows, hidden, num_parts, w_gate_up.stride(0), EPS, SWIGLU=swiglu,
        BLOCK_N=CONSUMER_ROWS, BLOCK_K=CONSUMER_BLOCK_K, BLOCK_PARTS=triton.next_power_of_2(num_parts), PDL=pdl,
        launch_pdl=pdl, num_warps=CONSUMER_WARPS,
    )  # fmt: skip
    return (y if swiglu else silu_and_mul(y)), new_res


def unfused_chain(a, w_o, residual, norm_weight, w_gate_up):
    """What the engine runs with its fused norms off (bench/decode_latency.py --norm-gemv-min-features):
    the GEMV, the fused add + RMSNorm kernel, the plain GEMV of gate|up, the SiLU-and-mul kernel."""
    normed, new_res = fused_add_rms_norm(gemv(a, w_o), residual, norm_weight, EPS)
    return silu_and_mul(gemv(normed, w_gate_up)), new_res


def base_chain(a, w_o, residual, norm_weight, w_gate_up, swiglu: bool):
    """What the engine runs: the GEMV, then the fused residual add + RMSNorm + gate|up (+ SwiGLU)."""
    y, new_res = rms_norm_gemv(gemv(a, w_o), residual, norm_weight, EPS, w_gate_up, swiglu=swiglu)
    return (y if swiglu else silu_and_mul(y)), new_res


def reference(a, w_o, residual, norm_weight, w_gate_up):
    """fp32 math on the rounded o_proj output and residual sum, as both chains round them."""
    y = F.linear(a.float(), w_o.float()).to(a.dtype)
    h = (y.float() + residual.float()).to(a.dtype)
    normed = h.float() * torch.rsqrt(h.float().pow(2).mean(dim=-1, keepdim=True) + EPS) * norm_weight.float()
    gate, up = F.linear(normed, w_gate_up.float()).chunk(2, dim=-1)
    return F.silu(gate) * up, h


def _rel_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def run_shape(name: str, dims: tuple, device: torch.device, dry: bool, read_bw: float | None) -> list[dict]:
    hidden, width, inter, swiglu = dims
    dtype = torch.float32 if dry else torch.bfloat16
    weight_bytes = (hidden * width + 2 * inter * hidden) * 2
    copies = 1 if dry else max(2, int(L2_BYTES // weight_bytes) + 1)
    w_os = [(torch.randn(hidden, width, device=device) / width**0.5).to(dtype) for _ in range(copies)]
    w_gus = [(torch.randn(2 * inter, hidden, device=device) / hidden**0.5).to(dtype) for _ in range(copies)]
    a = torch.randn(1, width, device=device).to(dtype)
    residual = (3 * torch.randn(1, hidden, device=device)).to(dtype)
    norm_weight = (1 + 0.3 * torch.randn(hidden, device=device)).to(dtype)
    expected, expected_res = reference(a, w_os[0], residual, norm_weight, w_gus[0])
    rows = []
    for chain in ("base", "trial", "unfused"):

        def call(i: int, chain=chain):
            if chain == "base":
                return base_chain(a, w_os[i], residual, norm_weight, w_gus[i], swiglu)
            if chain == "unfused":
                return unfused_chain(a, w_os[i], residual, norm_weight, w_gus[i])
            return trial_chain(a, w_os[i], residual, norm_weight, w_gus[i], swiglu, pdl=not dry)

        out, new_res = call(0)
        row = {"shape": name, "chain": chain, "max_rel_diff": _rel_diff(out, expected),
               "residual_rel_diff": _rel_diff(new_res, expected_res)}  # fmt: skip
        if not dry:

            def rotating(call=call, state={"i": 0}):  # noqa: B006 (the rotation's counter, one per chain)
                state["i"] = (state["i"] + 1) % copies
                return call(state["i"])

            row["us"] = _graph_us(rotating)
            row["of_read_bw"] = weight_bytes / 1e9 / (row["us"] * 1e-6) / read_bw
        rows.append(row)
        print(row, flush=True)
    return rows


def _markdown(result: dict) -> str:
    return f"# Norm-prep epilogue trial\n\n{result['meta']}\n\n" + table(result["rows"], [
        ("shape", "shape", ""), ("chain", "chain", ""), ("us", "us (o_proj + gate/up chain)", ".1f"),
        ("of_read_bw", "of read BW", ".0%"), ("max_rel_diff", "max rel diff", ".1e"),
        ("residual_rel_diff", "residual rel diff", ".1e"),
    ]) + "\n"  # fmt: skip


def main(argv=None) -> dict:
    args = trial_arguments(__doc__, argv)
    torch.manual_seed(0)
    device, read_bw, meta = trial_device(args.dry_run)
    if args.dry_run:
        shapes = {"tiny": (1100, 600, 24, True), "tiny, SiLU apart": (48, 40, 24, False)}
    else:
        from kernels._pdl import set_pdl

        set_pdl(True)  # the base chain's kernels follow the process setting
        shapes = SHAPES
    rows = []
    for name, dims in shapes.items():
        rows += run_shape(name, dims, device, args.dry_run, read_bw)
    result = {"meta": meta, "rows": rows}
    return write_trials(args.out, "norm_epilogue_trials", result, _markdown(result))


if __name__ == "__main__":
    main()
