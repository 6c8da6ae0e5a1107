"""The experts of a few tokens (decode): matrix-vector products that stream only the selected experts' rows.

Legend: T = tokens, K = experts per token, P = T * K pairs (p = t * K + k), E = experts, H = hidden size,
I = an expert's intermediate size.
    gate|up: act [P, I] = silu(w13[e, :I] x[t]) * (w13[e, I:] x[t]),  e = ids[t, k], t = p // K
    down:    y [T, H]   = sum_k weights[t, k] * w2[ids[t, k]] act[t * K + k]
Precision: float32 products and sums; act rounded once to x's dtype, y once after the sum over K (each
product act * weight * w2 in float32, summed inside one program in a fixed order: deterministic).

Why: at a handful of tokens the layer is a weight stream of the K experts each token picked. With no
alignment step and the top-k sum inside the down kernel, a decode step's routed experts are two
kernels after the router, reading each selected expert's rows once per token that picked it; where
tokens share experts (more tokens, few experts) the grouped GEMMs read each expert once instead
(kernels/moe_tiles.py's small_batch_max_tokens draws the line).

Kernels, each accumulating [rows, BLOCK_K] float32 products and reducing them ONCE at the end (a reduction
over 8 warps is a shared-memory round trip with barriers, which holds back the loads after it), with the
x tile in the weight tile's layout (kernels/gemv.py's x_tile):
- gate|up, one program per (pair, BLOCK_N outputs of I): ONE [2 BLOCK_N, BLOCK_K] tile whose rows
  alternate gate row n and up row I + n, so each chunk is a single load of both, walked along H; the
  sums split into (gate, up) pairs at the end;
- down, one program per (token, BLOCK_N rows of H): the token's K experts' rows along I, each chunk's
  act scaled by its slot's routed weight, all into the one accumulator (the weighted sum over K comes
  out of the single reduction).
UNROLL walks the chunks in straight-line code (H / BLOCK_K, or K x I / BLOCK_K for down: no loop-carried
dependency between loads, so the compiler issues them ahead), else in a loop of one chunk at a time: Triton
pipelines only loads that feed a tl.dot. At Qwen3-30B-A3B's experts (I = 768) down's loop of 16 short
chunks, a reduction after each expert, ran at half the read bandwidth (H200, 2026-11-29).
The tile (BLOCK_N, BLOCK_K, UNROLL, num_warps) of each kernel is per shape and GPU (kernels/moe_tiles.py:
bench/moe_tune.py's sweep, else TILE).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, interpreting
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.gemv import x_tile

TILE = {"BLOCK_N": 4, "BLOCK_K": 512, "UNROLL": True, "num_warps": 8}  # the untuned default of both kernels
INTERPRETER_TILE = {"BLOCK_N": 4, "BLOCK_K": 16, "UNROLL": True, "num_warps": 1}  # several chunks on small shapes
TILE_KEYS = tuple(TILE)
MAX_UNROLLED_CHUNKS = 64  # straight-line chunks a program at most; wider layers loop (Mixtral's I = 14336)


@triton.jit
def _accumulate_chunk(acc, rows, x_row, scale, n, n_mask, k0, K, BLOCK_K: tl.constexpr):
    """acc + rows[:, k0 : k0 + BLOCK_K] * (x_row[k0 : k0 + BLOCK_K] * scale), float32, 0 past K."""
    k = k0 + tl.arange(0, BLOCK_K)
    k_mask = k < K
    w = tl.load(rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    return acc + w.to(tl.float32) * (x_tile(x_row, n, k, k_mask) * scale)


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
    UNROLL: tl.constexpr,
    CHUNKS: tl.constexpr,  # cdiv(H, BLOCK_K), walked in straight-line code where UNROLL
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the expert ids (and x) are the kernels before's outputs
    pair = tl.program_id(0)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    j = tl.arange(0, 2 * BLOCK_N)  # tile row j: output n = j // 2, gate row (j even) or up row (j odd)
    n = tl.program_id(1) * BLOCK_N + j // 2
    n_mask = n < inter
    rows = w_ptr + expert * stride_we + (n + (j % 2) * inter).to(tl.int64)[:, None] * hidden  # [2 BLOCK_N, 1]
    acc = tl.zeros([2 * BLOCK_N, BLOCK_K], dtype=tl.float32)
    if UNROLL:
        for c in tl.static_range(CHUNKS):
            acc = _accumulate_chunk(acc, rows, x_row, 1.0, n, n_mask, c * BLOCK_K, hidden, BLOCK_K)
    else:
        for k0 in range(0, hidden, BLOCK_K):
            acc = _accumulate_chunk(acc, rows, x_row, 1.0, n, n_mask, k0, hidden, BLOCK_K)
    gate, up = tl.split(tl.reshape(tl.sum(acc, axis=1), (BLOCK_N, 2)))
    act = gate / (1.0 + tl.exp(-gate)) * up
    out = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(act_ptr + pair.to(tl.int64) * inter + out, act.to(act_ptr.dtype.element_ty), mask=out < inter)


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
    UNROLL: tl.constexpr,
    CHUNKS: tl.constexpr,  # cdiv(I, BLOCK_K), walked in straight-line code where UNROLL
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < hidden
    row_offsets = n.to(tl.int64)[:, None] * inter  # [BLOCK_N, 1]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        pair = token * TOP_K + slot
        rows = w_ptr + tl.load(ids_ptr + pair).to(tl.int64) * stride_we + row_offsets
        routed = tl.load(routed_ptr + pair)
        act_row = act_ptr + pair * inter
        if UNROLL:
            for c in tl.static_range(CHUNKS):
                acc = _accumulate_chunk(acc, rows, act_row, routed, n, n_mask, c * BLOCK_K, inter, BLOCK_K)
        else:
            for k0 in range(0, inter, BLOCK_K):
                acc = _accumulate_chunk(acc, rows, act_row, routed, n, n_mask, k0, inter, BLOCK_K)
    tl.store(out_ptr + token * hidden + n, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=n_mask)


def gemv_tile(tiles: dict | None, width: int) -> dict:
    """The default tile (TILE; INTERPRETER_TILE on the interpreter) with `tiles`' entries over it, and the
    chunks of `width` (H for gate|up, K x I for down) a program walks; UNROLL off past MAX_UNROLLED_CHUNKS."""
    config = dict(INTERPRETER_TILE if interpreting() else TILE)
    unknown = set(tiles or {}) - set(config)
    if unknown:
        raise ValueError(f"tiles may set only {sorted(config)}, got {sorted(unknown)}")
    config.update(tiles or {})
    config["UNROLL"] = bool(config["UNROLL"]) and triton.cdiv(width, config["BLOCK_K"]) <= MAX_UNROLLED_CHUNKS
    return config


def moe_gemv_gate_up(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor, tiles: dict | None = None) -> torch.Tensor:
    """act [P, I] of x [T, H] through each pair's expert's gate|up (w13 [E, 2I, H]) and SiLU-and-mul."""
    check_device(_moe_gemv_gate_up_kernel, "x, w13 and ids", x, w13, ids)
    if x.stride(-1) != 1 or not w13.is_contiguous() or not ids.is_contiguous() or ids.dtype != torch.int32:
        raise ValueError("x must be contiguous in its last dim, w13 contiguous and ids contiguous int32")
    num_pairs, inter, hidden = ids.numel(), w13.shape[1] // 2, w13.shape[2]
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    config = gemv_tile(tiles, hidden)
    grid = (num_pairs, triton.cdiv(inter, config["BLOCK_N"]))
    _moe_gemv_gate_up_kernel[grid](
        x, w13, ids, act, inter, hidden, x.stride(0), w13.stride(0), TOP_K=ids.shape[1], **config,
        CHUNKS=triton.cdiv(hidden, config["BLOCK_K"]), num_stages=1, **pdl_options(x.device),
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
    config = gemv_tile(tiles, top_k * inter)
    grid = (num_tokens, triton.cdiv(hidden, config["BLOCK_N"]))
    _moe_gemv_down_kernel[grid](
        act, w2, ids, weights, out, hidden, inter, w2.stride(0), TOP_K=top_k, **config,
        CHUNKS=triton.cdiv(inter, config["BLOCK_K"]), num_stages=1, **pdl_options(act.device),
    )  # fmt: skip
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
