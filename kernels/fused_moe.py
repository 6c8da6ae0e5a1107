"""The routed experts of an MoE layer: each token through its K experts' SwiGLU MLPs, weighted and summed.

Legend: T = tokens, H = hidden size, E = experts, I = an expert's intermediate size, K = experts per token,
P = T * K (token, slot) pairs, numbered p = t * K + k.
    fused_experts(x [T, H], w13 [E, 2I, H], w2 [E, H, I], weights [T, K] float32, ids [T, K] int32) -> [T, H]
    y[t] = sum_k weights[t, k] * w2[ids[t, k]] @ (silu(g) * u),  [g | u] = w13[ids[t, k]] @ x[t]
The expert weights keep nn.Linear's [out, in] layout (w13's rows: the gate's I, then the up's I), the
layout transformers 5 packs them in and the per-expert checkpoint tensors are copied into.

Two paths, both CUDA-graph safe (every shape follows T, K and E; nothing is read back to the host):
- few tokens (small_batch_max_tokens): kernels/moe_gemv.py, one program per pair (gate|up) and per
  token (down, whose program sums the token's K experts itself): only the selected experts' weights
  stream, no alignment;
- otherwise: kernels/moe_align.py sorts the pairs by expert into BLOCK_M-row segments, then
  kernels/moe_gemm.py runs two grouped GEMMs (gate|up with SiLU-and-mul in the epilogue, down with the
  routed weight multiplied in the epilogue) and the K rows of each token are summed.
Tile configurations: kernels/moe_tiles.py (tuned files, else a heuristic).

Precision contract: float32 products and sums; the activation silu(g) * u is rounded once to x's dtype
(both paths); the grouped path also rounds each weighted expert output to x's dtype before the sum over
K (at most K roundings more than the reference in 16-bit dtypes; none in float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_expert_shapes(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                        ids: torch.Tensor) -> None:  # fmt: skip
    """The shapes and dtypes every path of fused_experts accepts; ValueError naming the argument otherwise."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"w13 must be [E, 2I, H] and w2 [E, H, I], got {tuple(w13.shape)} and {tuple(w2.shape)}")
    num_experts, two_inter, hidden = w13.shape
    if hidden != x.shape[1] or two_inter % 2 or tuple(w2.shape) != (num_experts, hidden, two_inter // 2):
        raise ValueError(
            f"expert weights do not fit x [T, H={x.shape[1]}]: w13 {tuple(w13.shape)} must be [E, 2I, H] and "
            f"w2 {tuple(w2.shape)} [E, H, I]"
        )
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"w13 and w2 must have x's dtype {x.dtype}, got {w13.dtype} and {w2.dtype}")
    if ids.dim() != 2 or ids.shape[0] != x.shape[0] or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"ids and weights must both be [T={x.shape[0]}, K], got {tuple(ids.shape)} and {tuple(weights.shape)}"
        )
    if ids.dtype != torch.int32 or weights.dtype != torch.float32:
        raise ValueError(f"ids must be int32 and weights float32, got {ids.dtype} and {weights.dtype}")
    if ids.shape[1] > num_experts:
        raise ValueError(f"top-k ({ids.shape[1]}) must be at most the number of experts ({num_experts})")


def fused_experts(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
    *, tiles: dict | None = None,
) -> torch.Tensor:  # fmt: skip
    """The routed experts' output [T, H] by the Triton kernels (see the module docstring).

    tiles: overrides of kernels/moe_tiles.py's choice (tests, sweeps): "path" ("gemv" or "grouped"),
    the grouped GEMMs' BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, and the one-token
    kernels' tiles "gemv_gate_up" / "gemv_down" (dicts of kernels/moe_gemv.py's TILE_KEYS).
    """
    from kernels.moe_align import moe_align
    from kernels.moe_gemm import moe_gemm_down, moe_gemm_gate_up
    from kernels.moe_gemv import moe_gemv_down, moe_gemv_gate_up
    from kernels.moe_tiles import moe_tiles

    check_expert_shapes(x, w13, w2, weights, ids)
    num_tokens, top_k = ids.shape
    num_experts, two_inter, hidden = w13.shape
    if num_tokens == 0:
        return torch.empty_like(x)
    config = moe_tiles(num_tokens, num_experts, top_k, hidden, two_inter // 2, x.dtype, x.device, tiles)
    if config["path"] == "gemv":
        act = moe_gemv_gate_up(x, w13, ids, config["gemv_gate_up"])  # [P, I]
        return moe_gemv_down(act, w2, weights, ids, config["gemv_down"])  # [T, H]
    sorted_ids, block_experts, num_padded = moe_align(ids, num_experts, config["BLOCK_M"])
    act = moe_gemm_gate_up(x, w13, ids, sorted_ids, block_experts, num_padded, config)  # [P, I]
    out = moe_gemm_down(act, w2, weights, sorted_ids, block_experts, num_padded, config)  # [P, H], weighted
    # NOTE: the sum over K is a reduction of its own (not atomics in the GEMM's epilogue), so the
    # order of the additions, and the result's bits, never depend on which program ran first
    return out.view(num_tokens, top_k, hidden).sum(dim=1)  # float32 accumulation, one rounding


def fused_experts_ref(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The routed experts in plain torch, expert by expert over the pairs routed to it, in float32 with the
    activation rounded to x's dtype. Reads the per-expert counts back to the host: not for CUDA graphs."""
    check_expert_shapes(x, w13, w2, weights, ids)
    num_tokens, top_k = ids.shape
    num_experts, hidden = w13.shape[0], w13.shape[2]
    flat_ids = ids.reshape(-1).long()  # [P]
    order = torch.argsort(flat_ids, stable=True)  # pairs grouped by expert
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    out = torch.zeros(num_tokens * top_k, hidden, dtype=torch.float32, device=x.device)  # [P, H]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        gate, up = F.linear(x[pairs // top_k].float(), w13[expert].float()).chunk(2, dim=-1)  # [n, I] each
        act = (F.silu(gate) * up).to(x.dtype)
        out[pairs] = F.linear(act.float(), w2[expert].float())  # [n, H]
    out = out.view(num_tokens, top_k, hidden) * weights.unsqueeze(-1)
    return out.sum(dim=1).to(x.dtype)
