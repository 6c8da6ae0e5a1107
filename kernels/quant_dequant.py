"""A quantized weight dequantized whole into the model's dtype, for the steps whose matmul is compute-bound.

Legend: N = output features, K = input features, G = a scale's group along K (kernels/quant_formats.py).
    dequantize(codes, ...) -> W [N, K] in x's dtype: int8 q s; int4 (q - z) s; nf4 NF4_CODEBOOK[q] absmax
Math: each weight in fp32, rounded once to the dtype: what the tensor-core tiles of kernels/quant_gemm.py
hand their dot.

Why: above STREAMING_MAX_TOKENS tokens a step's matmul is bound by its FLOPs, and cuBLAS's bf16 GEMM runs
at the GPU's matmul rate, where a Triton GEMM that dequantizes each tile in its loop moved every weight
through shared memory twice (decision 0070). Dequantizing once costs one write and one read of W in 16
bits (2.5 bytes a weight against a 4-bit weight's half byte): at 256 tokens the GEMM's own time is about
that, at a 2,048-token prefill chunk a tenth of it.

Kernel: a program dequantizes a [BLOCK_N, BLOCK_K] tile of W inside one scale group (one scale and zero
point a row) from its [BLOCK_N, BLOCK_K / 2] bytes or [BLOCK_N, BLOCK_K] int8 codes. A byte's two 4-bit
weights are adjacent columns: into a 16-bit dtype they are stored as one 32-bit word, so the tile keeps the
bytes' layout (interleaving the two halves in registers moved them through shared memory).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_gemv import INT8

BLOCK_N = 64
MAX_BLOCK_K = 128  # a program's columns: one scale group, or 128 columns of one (larger groups, per channel)


@triton.jit
def _dequantize_kernel(
    w_ptr,  # codes: int8 [N, K], or uint8 [N, K / 2] (4-bit)
    ws_ptr,  # fp32 [N, K / G]
    wz_ptr,  # uint8 [N, K / G] (HAS_ZEROS)
    codebook_ptr,  # nf4: [16] fp32
    out_ptr,  # [N, K] model dtype, or the same as int32 pairs (PAIRS)
    N,
    K,
    num_scale_cols,
    FORMAT: tl.constexpr,  # kernels/quant_gemv.py's ids: 1 int8, 2 int4, 3 nf4
    GROUP: tl.constexpr,  # G (K for per channel)
    HAS_ZEROS: tl.constexpr,
    PAIRS: tl.constexpr,  # 4-bit into a 16-bit dtype: a byte's two weights stored as one 32-bit word
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # divides GROUP: the program's columns share one scale a row
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rows = n[:, None].to(tl.int64)
    n_mask = (n < N)[:, None]
    col = k0 // GROUP
    scale = tl.load(ws_ptr + rows * num_scale_cols + col, mask=n_mask, other=0.0)  # [BLOCK_N, 1]
    if FORMAT == 1:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = n_mask & (k < K)[None, :]
        q = tl.load(w_ptr + rows * K + k[None, :], mask=mask, other=0).to(tl.float32)
        tl.store(out_ptr + rows * K + k[None, :], (q * scale).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        j = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # bytes: columns 2j (low nibble) and 2j + 1 (high)
        mask = n_mask & (j < K // 2)[None, :]
        b = tl.load(w_ptr + rows * (K // 2) + j[None, :], mask=mask, other=0).to(tl.int32)
        if FORMAT == 3:
            lo = tl.load(codebook_ptr + (b & 15)) * scale
            hi = tl.load(codebook_ptr + (b >> 4)) * scale
        else:
            if HAS_ZEROS:
                z = tl.load(wz_ptr + rows * num_scale_cols + col, mask=n_mask, other=0).to(tl.int32)
            else:
                z = 8
            lo = ((b & 15) - z).to(tl.float32) * scale
            hi = ((b >> 4) - z).to(tl.float32) * scale
        if PAIRS:  # one 32-bit store a byte: the rows stay contiguous, no interleave of the two halves
            lo16 = lo.to(out_ptr.dtype.element_ty).to(tl.int16, bitcast=True).to(tl.int32) & 65535
            hi16 = hi.to(out_ptr.dtype.element_ty).to(tl.int16, bitcast=True).to(tl.int32)
            out_words = out_ptr.to(tl.pointer_type(tl.int32))
            tl.store(out_words + rows * (K // 2) + j[None, :], lo16 | (hi16 << 16), mask=mask)
        else:
            tl.store(out_ptr + rows * K + 2 * j[None, :], lo.to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(out_ptr + rows * K + 2 * j[None, :] + 1, hi.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize(
    codes: torch.Tensor,
    fmt: int,
    num_in: int,
    scales: torch.Tensor,
    group: int,
    dtype: torch.dtype,
    *,
    zeros: torch.Tensor | None = None,
    codebook: torch.Tensor | None = None,
) -> torch.Tensor:
    """W [N, K] in `dtype` from a weight in kernels/quant_formats.py's layout (checked by the caller)."""
    num_out = codes.shape[0]
    out = torch.empty(num_out, num_in, device=codes.device, dtype=dtype)
    # a group's columns (32, 64, 128: powers of two), or 128 of a larger one; per channel any width
    block_k = min(triton.next_power_of_2(group), MAX_BLOCK_K) if group >= num_in else min(group, MAX_BLOCK_K)
    pairs = fmt != INT8 and dtype in (torch.bfloat16, torch.float16)
    grid = (triton.cdiv(num_out, BLOCK_N), triton.cdiv(num_in, block_k))
    _dequantize_kernel[grid](
        codes, scales, zeros if zeros is not None else codes, codebook if codebook is not None else scales, out,
        num_out, num_in, scales.shape[1],
        FORMAT=fmt, GROUP=group, HAS_ZEROS=zeros is not None, PAIRS=pairs, BLOCK_N=BLOCK_N, BLOCK_K=block_k,
        num_warps=4,
    )  # fmt: skip
    return out
