"""Grouped expert GEMMs over the aligned pairs (kernels/moe_align.py): one launch for all experts.

Legend: T = tokens, K = experts per token, P = T * K pairs (p = t * K + k), E = experts, H = hidden size,
I = an expert's intermediate size, M/N/Kb = BLOCK_M/BLOCK_N/BLOCK_K.
    gate|up: act [P, I] = silu(x[p // K] w13[e, :I]^T) * (x[p // K] w13[e, I:]^T)      (SiLU-and-mul fused)
    down:    out [P, H] = weights[p] * (act[p] w2[e]^T)                                 (routed weight fused)
for every pair p routed to expert e. The weights keep nn.Linear's [out, in] layout ([E, 2I, H], [E, H, I]).
Precision: float32 accumulation (true fp32 products for fp32 inputs), one rounding to the output dtype.

Kernel: a program owns one BLOCK_M-row block of sorted_ids (all rows one expert's, by the alignment) and
one BLOCK_N-column tile of the output; it walks the reduction dim in BLOCK_K steps, gathering its rows of
the input by pair index and reading the expert's weight tile [BLOCK_K, BLOCK_N] (two, gate and up, for the
gated GEMM), and scatters its rows to the pairs' output rows. Programs past num_padded return at once, so
the grid is sized for the worst routing (CUDA-graph safe). Programs are ordered in groups of GROUP_M row
blocks per column tile, so consecutive programs reuse an expert's weight tiles from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, dot_dtype, dot_precision
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


@triton.jit
def _moe_gemm_kernel(
    a_ptr,  # gate|up: x [T, H]; down: act [P, I]; last dim contiguous
    w_ptr,  # [E, N_w, Kr] (N_w = 2N for the gated GEMM), contiguous
    out_ptr,  # [P, N]
    routed_ptr,  # [P] float32 routed weights (read where MUL_WEIGHT)
    sorted_ptr,  # [S] int32 pair per row, P for padding
    block_experts_ptr,  # [S / M] int32
    num_padded_ptr,  # [1] int32
    N,
    Kr,  # the reduction dim: H (gate|up) or I (down)
    num_pairs,
    stride_a,
    stride_we,
    stride_wn,
    stride_out,
    A_ROW_DIV: tl.constexpr,  # K for gate|up (x's row of pair p is p // K), 1 for down
    GATED: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the pairs, their order and the activations are earlier kernels' outputs
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_m = tl.num_programs(0) // num_pid_n
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_mask = pairs < num_pairs
    a_rows = a_ptr + (pairs // A_ROW_DIV).to(tl.int64)[:, None] * stride_a  # [M, 1]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w_cols = w_ptr + expert * stride_we + cols.to(tl.int64)[None, :] * stride_wn  # [1, N]: w[e, n, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, Kr, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < Kr
        a = tl.load(a_rows + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b_mask = k_mask[:, None] & col_mask[None, :]
        b = tl.load(w_cols + ks[:, None], mask=b_mask, other=0.0)  # [Kb, N]: w[e, n, k] at (k, n)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
        if GATED:
            b_up = tl.load(w_cols + N * stride_wn + ks[:, None], mask=b_mask, other=0.0)
            acc_up = tl.dot(a.to(DOT_DTYPE), b_up.to(DOT_DTYPE), acc_up, input_precision=DOT_PRECISION)
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(routed_ptr + pairs, mask=row_mask, other=0.0)[:, None]
    out = out_ptr + pairs.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def _launch(a, w, out, routed, sorted_ids, block_experts, num_padded, num_out, a_row_div, gated, tiles) -> None:
    """One grouped GEMM; routed (float32 [P]) or None for no routed weight."""
    config = {k: tiles[k] for k in TILE_KEYS}
    num_blocks = block_experts.numel()
    grid = (num_blocks * triton.cdiv(num_out, config["BLOCK_N"]),)
    _moe_gemm_kernel[grid](
        a, w, out, routed if routed is not None else out, sorted_ids, block_experts, num_padded, num_out,
        a.shape[1], out.shape[0],
        a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=routed is not None, DOT_DTYPE=dot_dtype(a.dtype),
        DOT_PRECISION=dot_precision(a.dtype), **config, **pdl_options(a.device),
    )  # fmt: skip


def _check(name: str, a: torch.Tensor, w: torch.Tensor, sorted_ids, block_experts, num_padded, tiles: dict) -> None:
    check_device(_moe_gemm_kernel, f"{name}'s tensors", a, w, sorted_ids, block_experts, num_padded)
    missing = set(TILE_KEYS) - set(tiles)
    if missing:
        raise ValueError(f"tiles lack {sorted(missing)}")
    if sorted_ids.numel() != block_experts.numel() * tiles["BLOCK_M"]:
        raise ValueError(
            f"sorted_ids ({sorted_ids.numel()} rows) must be block_experts ({block_experts.numel()}) x BLOCK_M "
            f"({tiles['BLOCK_M']}): align with the GEMM's BLOCK_M"
        )
    for t, what in ((sorted_ids, "sorted_ids"), (block_experts, "block_experts"), (num_padded, "num_padded")):
        if t.dtype != torch.int32 or not t.is_contiguous():
            raise ValueError(f"{what} must be contiguous int32, got {t.dtype}")
    if a.stride(-1) != 1 or not w.is_contiguous():
        raise ValueError(f"{name}: the input must be contiguous in its last dim and the weights contiguous")


def moe_gemm_gate_up(
    x: torch.Tensor,
    w13: torch.Tensor,
    ids: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_experts: torch.Tensor,
    num_padded: torch.Tensor,
    tiles: dict,
) -> torch.Tensor:
    """act [P, I] = silu(gate) * up of each pair's expert on its token's row of x [T, H] (w13 [E, 2I, H])."""
    _check("gate|up", x, w13, sorted_ids, block_experts, num_padded, tiles)
    num_pairs, inter = ids.numel(), w13.shape[1] // 2
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    _launch(x, w13, act, None, sorted_ids, block_experts, num_padded, inter, ids.shape[1], True, tiles)
    return act


def moe_gemm_down(
    act: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_experts: torch.Tensor,
    num_padded: torch.Tensor,
    tiles: dict,
) -> torch.Tensor:
    """out [P, H] = weights[p] * act[p] w2[e]^T of each pair p (act [P, I], w2 [E, H, I], weights [T, K])."""
    _check("down", act, w2, sorted_ids, block_experts, num_padded, tiles)
    if weights.dtype != torch.float32 or not weights.is_contiguous() or weights.numel() != act.shape[0]:
        raise ValueError(f"weights must be contiguous float32 with one value per pair ({act.shape[0]})")
    out = torch.empty(act.shape[0], w2.shape[1], dtype=act.dtype, device=act.device)
    _launch(act, w2, out, weights, sorted_ids, block_experts, num_padded, w2.shape[1], 1, False, tiles)
    return out


def moe_gemm_ref(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_experts: torch.Tensor,
    num_padded: torch.Tensor,
    num_pairs: int,
    a_row_div: int,
    gated: bool,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Either GEMM in plain torch over the same aligned rows, float32, one rounding: [P, N]."""
    block_m = sorted_ids.numel() // block_experts.numel()
    num_out = w.shape[1] // 2 if gated else w.shape[1]
    out = torch.zeros(num_pairs, num_out, dtype=torch.float32, device=a.device)
    for block in range(int(num_padded.item()) // block_m):
        pairs = sorted_ids[block * block_m : (block + 1) * block_m].long()
        pairs = pairs[pairs < num_pairs]
        y = a[pairs // a_row_div].float() @ w[int(block_experts[block])].float().T
        if gated:
            y = torch.nn.functional.silu(y[:, :num_out]) * y[:, num_out:]
        if weights is not None:
            y = y * weights.reshape(-1)[pairs, None]
        out[pairs] = y
    return out.to(a.dtype)
