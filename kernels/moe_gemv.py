"""The experts of a few tokens (decode): matrix-vector products that stream only the selected experts' rows.

Legend: T = tokens, K = experts per token, P = T * K pairs (p = t * K + k), E = experts, H = hidden size,
I = an expert's intermediate size.
    gate|up: act [P, I] = silu(w13[e, :I] x[t]) * (w13[e, I:] x[t]),  e = ids[t, k], t = p // K
    down:    y [T, H]   = sum_k weights[t, k] * w2[ids[t, k]] act[t * K + k]
Precision: float32 products and sums; act rounded once to x's dtype, y once after the sum over K (in the
order k = 0 .. K - 1, inside one program: deterministic).

Why: at a handful of tokens the layer is a weight stream of the K experts each token picked. With no
alignment step and the top-k sum inside the down kernel, a decode step's routed experts are two
kernels after the router, reading each selected expert's rows once per token that picked it; where
tokens share experts (more tokens, few experts) the grouped GEMMs read each expert once instead
(kernels/moe_tiles.py's small_batch_max_tokens draws the line).

Kernels: gate|up, one program per (pair, BLOCK_N rows of I): BLOCK_N gate rows and the BLOCK_N up rows
I below them, walked along H in BLOCK_K chunks into [BLOCK_N, BLOCK_K] float32 tiles reduced once at the
end (kernels/gemv.py's shape). Down, one program per (token, BLOCK_N rows of H): for each of the token's
K experts, its rows along I, then the weighted sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, interpreting
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

TILE = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 8}  # kernels/gemv.py's one-token tile
INTERPRETER_TILE = {"BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1}  # K loops of several chunks on small shapes


@triton.jit
def _moe_gemv_gate_up_kernel(
    x_ptr,  # [T, H], last dim contiguous
    w_ptr,  # [E, 2I, H] contiguous
    ids_ptr,  # [P] int32
    act_ptr,  # [P, I] contiguous
    inter,  # I
    hidden,  # H
    stride_x,
    stride_we,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the expert ids (and x) are the kernels before's outputs
    pair = tl.program_id(0)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < inter
    gate_rows = w_ptr + expert * stride_we + n.to(tl.int64)[:, None] * hidden  # [BLOCK_N, 1]
    up_rows = gate_rows + inter * hidden
    acc_gate = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < hidden
        x = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        w_mask = n_mask[:, None] & k_mask[None, :]
        acc_gate += tl.load(gate_rows + k[None, :], mask=w_mask, other=0.0).to(tl.float32) * x
        acc_up += tl.load(up_rows + k[None, :], mask=w_mask, other=0.0).to(tl.float32) * x
    gate = tl.sum(acc_gate, axis=1)
    up = tl.sum(acc_up, axis=1)
    act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(act_ptr + pair.to(tl.int64) * inter + n, act.to(act_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _moe_gemv_down_kernel(
    act_ptr,  # [P, I] contiguous
    w_ptr,  # [E, H, I] contiguous
    ids_ptr,  # [P] int32
    routed_ptr,  # [P] float32
    out_ptr,  # [T, H] contiguous
    hidden,  # H
    inter,  # I
    stride_we,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < hidden
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        pair = token * TOP_K + slot
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        rows = w_ptr + expert * stride_we + n.to(tl.int64)[:, None] * inter  # [BLOCK_N, 1]
        act_row = act_ptr + pair * inter
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < inter
            a = tl.load(act_row + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            acc += tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32) * a
        total += tl.load(routed_ptr + pair) * tl.sum(acc, axis=1)
    tl.store(out_ptr + token * hidden + n, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def gemv_tile(tiles: dict | None) -> dict:
    config = dict(INTERPRETER_TILE if interpreting() else TILE)
    unknown = set(tiles or {}) - set(config)
    if unknown:
        raise ValueError(f"tiles may set only {sorted(config)}, got {sorted(unknown)}")
    config.update(tiles or {})
    return config


def moe_gemv_gate_up(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor, tiles: dict | None = None) -> torch.Tensor:
    """act [P, I] of x [T, H] through each pair's expert's gate|up (w13 [E, 2I, H]) and SiLU-and-mul."""
    check_device(_moe_gemv_gate_up_kernel, "x, w13 and ids", x, w13, ids)
    if x.stride(-1) != 1 or not w13.is_contiguous() or not ids.is_contiguous() or ids.dtype != torch.int32:
        raise ValueError("x must be contiguous in its last dim, w13 contiguous and ids contiguous int32")
    num_pairs, inter, hidden = ids.numel(), w13.shape[1] // 2, w13.shape[2]
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    config = gemv_tile(tiles)
    grid = (num_pairs, triton.cdiv(inter, config["BLOCK_N"]))
    _moe_gemv_gate_up_kernel[grid](
        x, w13, ids, act, inter, hidden, x.stride(0), w13.stride(0), TOP_K=ids.shape[1], **config,
        **pdl_options(x.device),
    )  # fmt: skip
    return act


def moe_gemv_down(
    act: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, tiles: dict | None = None
) -> torch.Tensor:
    """y [T, H] = sum over each token's K pairs of weights * (act [P, I] through the pair's w2 [E, H, I])."""
    check_device(_moe_gemv_down_kernel, "act, w2, weights and ids", act, w2, weights, ids)
    if not (act.is_contiguous() and w2.is_contiguous() and weights.is_contiguous() and ids.is_contiguous()):
        raise ValueError("act, w2, weights and ids must be contiguous")
    if weights.dtype != torch.float32 or ids.dtype != torch.int32:
        raise ValueError(f"weights must be float32 and ids int32, got {weights.dtype} and {ids.dtype}")
    num_tokens, top_k = ids.shape
    hidden, inter = w2.shape[1], w2.shape[2]
    out = torch.empty(num_tokens, hidden, dtype=act.dtype, device=act.device)
    config = gemv_tile(tiles)
    grid = (num_tokens, triton.cdiv(hidden, config["BLOCK_N"]))
    _moe_gemv_down_kernel[grid](
        act, w2, ids, weights, out, hidden, inter, w2.stride(0), TOP_K=top_k, **config, **pdl_options(act.device)
    )
    return out


def moe_gemv_ref(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(act [P, I], y [T, H]) of both kernels in plain torch: gathered expert weights, float32, their roundings."""
    num_tokens, top_k = ids.shape
    inter = w2.shape[2]
    flat = ids.reshape(-1).long()
    rows = x.float().repeat_interleave(top_k, dim=0)  # [P, H]
    gate_up = torch.einsum("ph,pnh->pn", rows, w13[flat].float())  # [P, 2I]
    act = (torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype)
    down = torch.einsum("pi,phi->ph", act.float(), w2[flat].float()) * weights.reshape(-1, 1)  # [P, H]
    return act, down.view(num_tokens, top_k, -1).sum(dim=1).to(x.dtype)
