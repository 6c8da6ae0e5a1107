"""Memory-bound kernels (RMSNorm, fused add + RMSNorm, RoPE, SiLU-mul, KV store) against
their torch references run eagerly and through torch.compile.

Legend: T = tokens, H = hidden size (RoPE and the KV store use the heads of a model
with that hidden size, D = 128, GQA 4; SiLU-mul reads [T, 2H] and writes [T, H]).
Every figure is bytes moved (bench/kernel_math.py) over the median time per call,
taken from a CUDA graph of the calls where it can be captured (GPU time, as the
engine's graphed decode sees it; the torch eager KV store syncs and runs unGraphed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.kernel_math import HEAD_DIM, SMALL_KERNEL_BYTES, heads_for_hidden
from bench.kernel_timing import Bench, gbps
from kernels.kv_store import store_kv, store_kv_ref
from kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref
from kernels.rope import apply_rope, apply_rope_ref
from kernels.rope_store_kv import rope_store_kv, rope_store_kv_ref
from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

MAX_POSITIONS = 32768

# op -> (inferq kernel, torch reference)
OPS: dict[str, tuple[Callable, Callable]] = {
    "rms_norm": (rms_norm, rms_norm_ref),
    "fused_add_rms_norm": (fused_add_rms_norm, fused_add_rms_norm_ref),
    "rope": (apply_rope, apply_rope_ref),
    "silu_and_mul": (silu_and_mul, silu_and_mul_ref),
    "store_kv": (store_kv, store_kv_ref),
    "rope_store_kv": (rope_store_kv, rope_store_kv_ref),
}
HOST_SYNCING_REFERENCES = ("store_kv", "rope_store_kv")  # boolean-mask indexing: no CUDA graph for eager


def make_inputs(op: str, tokens: int, hidden: int, device: torch.device, dtype: torch.dtype) -> tuple:
    """One set of arguments of `op` for T tokens at hidden size H (random, never zeros)."""

    def randn(*shape):
        return torch.randn(*shape, device=device).to(dtype)

    eps = 1e-6
    if op == "rms_norm":
        return randn(tokens, hidden), randn(hidden), eps
    if op == "fused_add_rms_norm":
        return randn(tokens, hidden), randn(tokens, hidden), randn(hidden), eps
    if op == "silu_and_mul":
        return (randn(tokens, 2 * hidden),)
    num_heads, num_kv_heads = heads_for_hidden(hidden)
    angles = torch.rand(MAX_POSITIONS, HEAD_DIM // 2, device=device) * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)  # [P, D] fp32
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), device=device)
    block_size = 16
    num_blocks = -(-2 * tokens // block_size)  # a pool twice the tokens, slots scattered over it
    kv_cache = randn(2, num_blocks, block_size, num_kv_heads, HEAD_DIM)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    q = randn(tokens, num_heads, HEAD_DIM)
    k, v = randn(tokens, num_kv_heads, HEAD_DIM), randn(tokens, num_kv_heads, HEAD_DIM)
    if op == "rope":
        return q, k, positions, cos_sin
    if op == "store_kv":
        return k, v, kv_cache[0], kv_cache[1], slots
    if op == "rope_store_kv":
        return q, k, v, positions, cos_sin, kv_cache[0], kv_cache[1], slots
    raise ValueError(f"unknown op {op!r}")


def small_kernel_suite(bench: Bench, ops, token_counts, hiddens, dtype: torch.dtype = torch.bfloat16,
                       bandwidth_gbps: float | None = None) -> list[dict]:  # fmt: skip
    """A row per (op, T, H): GB/s of the kernel, torch eager and torch.compile, and their ratios.

    bandwidth_gbps: the ceiling each GB/s figure is divided by (the measured copy bandwidth).
    """
    rows = []
    elem = torch.finfo(dtype).bits // 8
    for op in ops:
        kernel, reference = OPS[op]
        compiled = None if bench.dry_run else torch.compile(reference, dynamic=True)
        for tokens in token_counts:
            for hidden in hiddens:
                nbytes = SMALL_KERNEL_BYTES[op](tokens, hidden, elem)
                inputs = [make_inputs(op, tokens, hidden, bench.device, dtype) for _ in range(bench.rotations(nbytes))]
                row = {"op": op, "T": tokens, "H": hidden, "bytes": nbytes, "rotations": len(inputs)}
                for name, fn in (("inferq", kernel), ("eager", reference), ("compile", compiled)):
                    if fn is None:
                        continue
                    try:
                        # NOTE: the torch KV store indexes with a boolean mask (a host sync): no graph
                        graph = name == "inferq" or op not in HOST_SYNCING_REFERENCES
                        ms, timing = bench.measure(fn, inputs, graph)
                    except Exception as e:  # noqa: BLE001 - a peer that fails to build is reported, not fatal
                        row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                        continue
                    row[f"{name}_us"] = ms * 1e3
                    row[f"{name}_timing"] = timing
                    row[f"{name}_gbps"] = gbps(nbytes, ms)
                    if bandwidth_gbps:
                        row[f"{name}_frac_bw"] = row[f"{name}_gbps"] / bandwidth_gbps
                del inputs
                row.update(same_size_copy(bench, nbytes))
                for peer in ("eager", "compile", "copy"):
                    if f"{peer}_us" in row and "inferq_us" in row:
                        row[f"inferq_vs_{peer}"] = row[f"{peer}_us"] / row["inferq_us"]
                rows.append(row)
                bench.free()
    return rows


def same_size_copy(bench: Bench, nbytes: int) -> dict:
    """copy_us / copy_gbps: torch's Tensor.copy_ (a device-to-device cudaMemcpyAsync) moving the
    kernel's bytes (nbytes / 2 read, nbytes / 2 written), timed the same way. A reference point
    for kernels of this size, not a floor: the driver's copy has fixed costs of its own and
    came out below the Triton kernels at some sizes (bench/results/h100/kernels.md).
    """
    half = max(1, nbytes // 4)  # bf16 elements per side: torch's copy then moves 16-byte vectors, as the kernels do

    def buffer() -> torch.Tensor:
        return torch.empty(half, dtype=torch.bfloat16, device=bench.device)

    pairs = [(buffer(), buffer()) for _ in range(bench.rotations(nbytes))]
    ms, timing = bench.measure(lambda dst, src: dst.copy_(src), pairs, graph=True)
    return {"copy_us": ms * 1e3, "copy_gbps": gbps(nbytes, ms), "copy_timing": timing}
