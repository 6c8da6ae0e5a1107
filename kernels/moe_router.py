"""The MoE router after its gate projection: softmax, top-k, optional renormalization, in one pass.

Legend: T = tokens, E = routed experts, K = experts per token (top-k).
    moe_route(logits [T, E], K, renormalize) -> (weights [T, K] float32, ids [T, K] int32)
Math: p = softmax(float32(logits)) over E; ids = the K largest, in descending order; weights = p[ids],
divided by their sum where `renormalize` (Mixtral always; Qwen and OLMoE where `norm_topk_prob`).
The selection compares the float32 logits (softmax is monotonic, and the logits' order is exact where
two probabilities may round equal); equal logits go to the lower expert index.
Precision contract: weights within float32 rounding of the reference (a few ulp: exp and the sums
run in another order); ids equal to the reference's wherever the K-th and (K+1)-th probabilities
differ by more than that rounding.

Kernel: each program owns BLOCK_T tokens (fewer where T is small) and all E experts of each ([BLOCK_T, BLOCK_E]
in registers); it takes the row maximum K times, each time recording (index, probability) and masking the
winner out.
Where transformers runs softmax, topk, a sum, a division and a cast (five kernels), this is one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float, check_last_dim_contiguous, interpreting
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

MAX_EXPERTS = 1024  # one program holds a token's E logits in registers
TILE_ELEMENTS = 4096  # BLOCK_T * BLOCK_E of a program
MAX_BLOCK_T = 64


@triton.jit
def _moe_route_kernel(
    logits_ptr,  # [T, E], last dim contiguous
    weights_ptr,  # [T, K] float32, contiguous
    ids_ptr,  # [T, K] int32, contiguous
    num_tokens,
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,  # next power of two >= TOP_K
    RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)  # the logits are the kernel before's output
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_mask = rows < num_tokens
    col_mask = cols < num_experts
    x = tl.load(
        logits_ptr + rows[:, None].to(tl.int64) * stride_logits + cols[None, :],
        mask=row_mask[:, None] & col_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    x = tl.where(col_mask[None, :], x, float("-inf"))  # padding columns never win; rows past T stay finite
    p = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    slots = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(x, axis=1)
        winner = tl.min(tl.where(x == best[:, None], cols[None, :], BLOCK_E), axis=1)  # lowest index of the max
        # NOTE: a NaN row has no winner; expert 0 keeps every later read of expert weights in bounds
        winner = tl.where(winner < num_experts, winner, 0)
        chosen = cols[None, :] == winner[:, None]
        w = tl.sum(tl.where(chosen, p, 0.0), axis=1)
        top_w = tl.where(slots[None, :] == k, w[:, None], top_w)
        top_i = tl.where(slots[None, :] == k, winner[:, None], top_i)
        x = tl.where(chosen, float("-inf"), x)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=1)[:, None]  # slots past TOP_K hold 0
    out = rows[:, None].to(tl.int64) * TOP_K + slots[None, :]
    out_mask = row_mask[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + out, top_w, mask=out_mask)
    tl.store(ids_ptr + out, top_i, mask=out_mask)


def route_tile(num_experts: int, num_tokens: int) -> dict:
    """BLOCK_T, BLOCK_E and num_warps for T tokens of E experts: about TILE_ELEMENTS logits a program, but no
    more token rows than T has (a decode step's one token in a [1, E] tile, whose K reductions stay within
    one warp: no shared-memory round trips), and 2 tokens on the interpreter, so that the CPU tests' odd
    token counts cross a tile border."""
    block_e = triton.next_power_of_2(num_experts)
    block_t = max(1, min(MAX_BLOCK_T, TILE_ELEMENTS // block_e, triton.next_power_of_2(num_tokens)))
    if interpreting():
        block_t = 2
    elements = block_t * block_e
    return {"BLOCK_T": block_t, "BLOCK_E": block_e, "num_warps": 1 if elements <= 256 else 4 if elements <= 2048 else 8}


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, K] float32, ids [T, K] int32) of the router logits [T, E] (see the module docstring)."""
    check_device(_moe_route_kernel, "logits", logits)
    check_float("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, E], got shape {tuple(logits.shape)}")
    check_last_dim_contiguous("logits", logits)
    num_tokens, num_experts = logits.shape
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"the router supports 1 to {MAX_EXPERTS} experts, got {num_experts}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}] (the number of experts), got {top_k}")
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    tile = route_tile(num_experts, num_tokens)
    _moe_route_kernel[(triton.cdiv(num_tokens, tile["BLOCK_T"]),)](
        logits, weights, ids, num_tokens, num_experts, logits.stride(0),
        TOP_K=top_k, BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=renormalize, **tile,
        **pdl_options(logits.device),
    )  # fmt: skip
    return weights, ids


def moe_route_ref(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' router after the gate: softmax in float32, topk, renormalize where asked."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
