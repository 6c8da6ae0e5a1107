"""One GEMM kernel for linear layers in every weight format, dequantizing the weight in registers.

Legend: M = tokens, N = output features, K = input features, G = a scale's group along K,
Bm/Bn/Bk = BLOCK_M/BLOCK_N/BLOCK_K.
    y [M, N] = x [M, K] W^T, W [N, K] dequantized chunk by chunk (kernels/quant_formats.py's layouts):
    dense: W; int8: q * s; int4: (q - z) * s; nf4: NF4_CODEBOOK[q] * absmax; fp8: q * scale with
    x itself fp8 (kernels/fp8_activations.py) times its scales.
Math: fp32 accumulation, one rounding of y to its dtype. The dequantized chunk is rounded to x's dtype
before a 16-bit tl.dot (the reference dequantizes in fp32: the difference is one rounding of w), except
per-channel int8, whose codes enter the dot exactly and whose scales multiply the sum; fp8 chunks multiply
as fp8 on the tensor cores, block scales applied to each 128-wide chunk's fp32 product.

Kernel: a program owns a Bm x Bn tile of y and walks K in Bk chunks: it loads the chunk's codes [Bn, Bk]
(4-bit formats: [Bn, Bk / 2] bytes), the chunk's scales [Bn, Bk / G] (one column where G >= Bk), and
dequantizes; then tl.dot of x's chunk [Bm, Bk] (Bm >= 16) with the chunk's transpose. One token takes
kernels/quant_gemv.py instead (launch_quant_gemm hands it over).
The same kernel is the weight-streaming GEMM for 2..64 tokens (Bm covers every token, so each weight
byte is read once, and Bn is small so the grid spreads over the SMs) and the tensor-core GEMM for larger
steps (128 x 128 tiles, programs grouped GROUP_M row blocks a column so weight tiles are reused from L2).
4-bit bytes: at 2..64 tokens the low nibbles multiply x's even columns and the high nibbles its odd ones
(SPLIT_NIBBLES: no interleave, which costs a pass of the dequantized chunk through shared memory); the
tensor-core tiles interleave them back, so that x's columns stay contiguous for the pipelined loads.
Scales that vary along K are applied per chunk; per-channel and per-tensor weight scales and per-token or
static activation scales once, to the accumulator.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import dot_dtype, dot_precision, interpreting
from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait
from kernels.quant_gemv import CHUNK_SCALE, FP8, INT4, NF4, NO_SCALE, launch_quant_gemv

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_NIBBLES", "num_warps", "num_stages")
FP8_SCALE_BLOCK = 128  # fp8 scales' block along K (weights 128 x 128, activations per 128 columns)
STREAMING_MAX_TOKENS = 64  # up to here one row block covers every token: the weights stream once
PER_CHANNEL_GROUP = 1 << 30  # W_GROUP of a single group along K (k0 // it is 0 for every chunk)


@triton.jit
def _scale_chunk(
    w,  # fp32 [Bn, WIDTH]: codes (or codebook values) of columns spread evenly over the chunk k0 .. k0 + Bk
    ws_rows,  # [Bn, 1] pointers to the rows' scales (or absmax)
    wz_rows,  # [Bn, 1] pointers to the rows' zero points (HAS_ZEROS)
    n_mask,
    k0,
    num_scale_cols,
    FORMAT: tl.constexpr,
    W_GROUP: tl.constexpr,
    SCALES_PER_CHUNK: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WIDTH: tl.constexpr,
):
    """(w - zero) * scale with the chunk's SCALES_PER_CHUNK groups: [Bn, groups, WIDTH / groups] (a reshape
    that splits the contiguous dim, free in registers)."""
    cols = k0 // W_GROUP + tl.arange(0, SCALES_PER_CHUNK)
    c_mask = n_mask[:, None] & (cols < num_scale_cols)[None, :]
    s = tl.load(ws_rows + cols[None, :], mask=c_mask, other=0.0)
    w3 = tl.reshape(w, (BLOCK_N, SCALES_PER_CHUNK, WIDTH // SCALES_PER_CHUNK))
    if FORMAT == 2:
        if HAS_ZEROS:
            w3 = w3 - tl.load(wz_rows + cols[None, :], mask=c_mask, other=0).to(tl.float32)[:, :, None]
        else:
            w3 = w3 - 8.0
    return tl.reshape(w3 * s[:, :, None], (BLOCK_N, WIDTH))


@triton.jit
def _nibbles(b, codebook_ptr, FORMAT: tl.constexpr):
    """Codes of 4 bits -> fp32: the int4 code itself, or nf4's codebook value, chosen among the 16 by selects.

    NOTE: not a gather from the table: on the H200 the 64-token streaming tile (4 warps, loads pipelined into
    the dot) gathered from addresses outside it (an illegal memory access, 2026-11-29); a select reads no memory
    a code."""
    if FORMAT == 3:
        idx = b.to(tl.int32)
        values = tl.zeros(b.shape, dtype=tl.float32) + tl.load(codebook_ptr)
        for i in tl.static_range(1, 16):
            values = tl.where(idx == i, tl.load(codebook_ptr + i), values)
        return values
    return b.to(tl.float32)


@triton.jit
def _x_chunk(x_rows, xs_ptr, m, m_mask, k, K, stride_xs, k0, SCALE_COLS: tl.constexpr, X_SCALE: tl.constexpr,
             X_WIDE: tl.constexpr):  # fmt: skip
    """x's columns k (a [WIDTH] vector): [Bm, WIDTH] as stored. X_WIDE: fp32 with fp8's per-128 activation
    scales applied (SCALE_COLS groups along the chunk)."""
    xk = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & (k < K)[None, :], other=0.0)
    if X_WIDE:
        xk = xk.to(tl.float32)
        if X_SCALE == 1:
            cols = k0 // 128 + tl.arange(0, SCALE_COLS)
            rows: tl.constexpr = xk.shape[0]
            width: tl.constexpr = xk.shape[1]
            xs_mask = m_mask[:, None] & (cols < tl.cdiv(K, 128))[None, :]
            xs = tl.load(xs_ptr + m[:, None] * stride_xs + cols[None, :], mask=xs_mask, other=0.0)
            x3 = tl.reshape(xk, (rows, SCALE_COLS, width // SCALE_COLS)) * xs[:, :, None]
            xk = tl.reshape(x3, (rows, width))
    return xk


@triton.jit
def _quant_gemm_kernel(
    x_ptr,  # [M, K] model dtype, or float8_e4m3fn (FORMAT fp8)
    xs_ptr,  # fp8 activation scales: [M, ceil(K / 128)] (X_SCALE chunk), [M, 1] or [1, 1] (X_SCALE end)
    w_ptr,  # codes: [N, K] (dense, int8, fp8) or [N, K / 2] bytes (int4, nf4); rows contiguous
    ws_ptr,  # weight scales / absmax, fp32, rows of stride_ws (0: one row for all)
    wz_ptr,  # int4 zero points uint8, rows of stride_ws (HAS_ZEROS)
    codebook_ptr,  # nf4: [16] fp32
    y_ptr,  # [M, N]
    M,
    N,
    K,
    stride_x,
    stride_xs,  # 0 for a static scale
    stride_w,
    stride_ws,
    stride_y,
    num_scale_cols,  # columns of the weight's scales (mask of the last chunk's)
    FORMAT: tl.constexpr,
    W_SCALE: tl.constexpr,
    W_GROUP: tl.constexpr,
    W_ROW_DIV: tl.constexpr,  # rows per scale row: 1, or 128 for fp8 blocks
    SCALES_PER_CHUNK: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    X_SCALE: tl.constexpr,
    DOT_FP8: tl.constexpr,
    SPLIT_NIBBLES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    rows_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % rows_m
    pid_n = (pid % in_group) // rows_m

    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_w
    ws_rows = ws_ptr + (n[:, None] // W_ROW_DIV).to(tl.int64) * stride_ws
    wz_rows = wz_ptr + (n[:, None] // W_ROW_DIV).to(tl.int64) * stride_ws
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < M
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x
    FOUR_BIT: tl.constexpr = FORMAT == 2 or FORMAT == 3
    PACK: tl.constexpr = 2 if FOUR_BIT else 1  # codes a stored element
    X_WIDE: tl.constexpr = FORMAT == 4 and not DOT_FP8  # fp8 x widened to fp32 (its scales applied)
    HALF: tl.constexpr = BLOCK_K // 2
    pdl_wait(PDL)  # x and its scales are the kernels' before

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # the chunk's stored codes: [Bn, Bk] (dense, int8, fp8) or bytes [Bn, Bk / 2] (4-bit), 0 past K
        kc = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
        codes = tl.load(w_rows + kc[None, :], mask=n_mask[:, None] & (kc < K // PACK)[None, :], other=0.0)
        if SPLIT_NIBBLES:
            # byte j of the chunk holds columns k0 + 2j (low nibble) and k0 + 2j + 1 (high): the low nibbles
            # multiply x's even columns and the high ones its odd columns, so the bytes stay in the layout
            # they were loaded in (interleaving them back costs a pass through shared memory a chunk)
            j = tl.arange(0, HALF)
            lo = _nibbles(codes & 15, codebook_ptr, FORMAT)
            hi = _nibbles(codes >> 4, codebook_ptr, FORMAT)
            lo = _scale_chunk(lo, ws_rows, wz_rows, n_mask, k0, num_scale_cols, FORMAT, W_GROUP,
                              SCALES_PER_CHUNK, HAS_ZEROS, BLOCK_N, HALF)  # fmt: skip
            hi = _scale_chunk(hi, ws_rows, wz_rows, n_mask, k0, num_scale_cols, FORMAT, W_GROUP,
                              SCALES_PER_CHUNK, HAS_ZEROS, BLOCK_N, HALF)  # fmt: skip
            x_even = _x_chunk(x_rows, xs_ptr, m, m_mask, k0 + 2 * j, K, 0, k0, 1, 0, False)
            x_odd = _x_chunk(x_rows, xs_ptr, m, m_mask, k0 + 2 * j + 1, K, 0, k0, 1, 0, False)
            acc = tl.dot(x_even.to(DOT_DTYPE), tl.trans(lo.to(DOT_DTYPE)), acc, input_precision=DOT_PRECISION)
            acc = tl.dot(x_odd.to(DOT_DTYPE), tl.trans(hi.to(DOT_DTYPE)), acc, input_precision=DOT_PRECISION)
        else:
            k = k0 + tl.arange(0, BLOCK_K)
            if FOUR_BIT:  # bytes interleaved back into [Bn, Bk] (the tensor-core tiles)
                w = _nibbles(tl.reshape(tl.join(codes & 15, codes >> 4), (BLOCK_N, BLOCK_K)), codebook_ptr, FORMAT)
            elif DOT_FP8:
                w = codes
            else:
                w = codes.to(tl.float32)
            if W_SCALE == 1 and not DOT_FP8:
                w = _scale_chunk(w, ws_rows, wz_rows, n_mask, k0, num_scale_cols, FORMAT, W_GROUP,
                                 SCALES_PER_CHUNK, HAS_ZEROS, BLOCK_N, BLOCK_K)  # fmt: skip
            xk = _x_chunk(x_rows, xs_ptr, m, m_mask, k, K, stride_xs, k0, SCALES_PER_CHUNK, X_SCALE,
                          X_WIDE)  # fmt: skip
            if DOT_FP8:  # one 128-wide chunk: its scales multiply the chunk's product
                # NOTE: sm_90 accumulates fp8 products in reduced precision unless told to promote: at most one
                # chunk's products accumulate so, also where `acc += part` becomes the dot's own accumulator
                part = tl.dot(xk, tl.trans(w), max_num_imprecise_acc=BLOCK_K)
                if X_SCALE == 1:
                    part = part * tl.load(xs_ptr + m * stride_xs + k0 // BLOCK_K, mask=m_mask, other=0.0)[:, None]
                if W_SCALE == 1:
                    ws = tl.load(ws_rows + k0 // BLOCK_K, mask=n_mask[:, None], other=0.0)
                    part = part * tl.reshape(ws, (1, BLOCK_N))
                acc += part
            else:
                acc = tl.dot(xk.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=DOT_PRECISION)
    if W_SCALE == 2:
        acc = acc * tl.reshape(tl.load(ws_rows, mask=n_mask[:, None], other=0.0), (1, BLOCK_N))
    if X_SCALE == 2:
        acc = acc * tl.load(xs_ptr + m * stride_xs, mask=m_mask, other=0.0)[:, None]
    y_ptrs = y_ptr + m[:, None].to(tl.int64) * stride_y + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def default_tiles(fmt: int, num_tokens: int, fp8_chunked: bool, on_gpu: bool) -> dict:
    """The tile for `num_tokens` rows of x in format `fmt` (fp8_chunked: fp8 whose scales vary along K, per
    128 columns, which fixes an fp8 tl.dot's chunk at 128).

    2..64 tokens (one token takes kernels/quant_gemv.py's tiles): every token in one row block (Bm the next
    power of two, at least tl.dot's 16) over 16 weight rows, so an N of 2048 still gives 128 programs, and
    8192 elements of x a chunk. They split 4-bit bytes into their low and
    high nibbles against x's even and odd columns (SPLIT_NIBBLES). Larger: 128 x 128 tensor-core tiles (64
    rows of x up to 128 tokens), 4-bit bytes interleaved back (x's columns contiguous for the pipelined
    loads). The interpreter takes small tiles (CPU time grows with the tile)."""
    four_bit = fmt in (INT4, NF4)
    if num_tokens <= STREAMING_MAX_TOKENS:
        block_m = max(16, triton.next_power_of_2(num_tokens))
        # x's chunk [Bm, Bk] stays at 8192 elements (registers and three stages of shared memory); nf4's
        # codebook lookups spill at 512 columns (bench/compile_check.py)
        block_k = max(128, min(256 if fmt == NF4 else 512, 8192 // block_m))
        # 8 warps at 512 columns: 4 spill the dequantized 4-bit chunk's registers at sm_90 (bench/compile_check.py)
        tile = dict(BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=block_k, GROUP_M=1, num_warps=8 if block_k >= 512 else 4)
        tile["num_stages"] = 3
    else:
        tile = dict(BLOCK_M=64 if num_tokens <= 128 else 128, BLOCK_N=128, BLOCK_K=128 if four_bit else 64)
        tile.update(GROUP_M=8, num_warps=8, num_stages=3)
    tile["SPLIT_NIBBLES"] = four_bit and num_tokens <= STREAMING_MAX_TOKENS
    if not on_gpu:
        tile.update(
            BLOCK_N=min(tile["BLOCK_N"], 16), BLOCK_K=min(tile["BLOCK_K"], 64), BLOCK_M=min(tile["BLOCK_M"], 16)
        )
        tile.update(num_stages=1)
    if fp8_chunked:
        tile["BLOCK_K"] = FP8_SCALE_BLOCK
    return tile


def launch_quant_gemm(
    x: torch.Tensor,
    codes: torch.Tensor,
    num_out: int,
    fmt: int,
    out_dtype: torch.dtype,
    *,
    w_scales: torch.Tensor | None = None,
    w_scale_at: int = NO_SCALE,
    w_group: int = 1,
    w_row_div: int = 1,
    zeros: torch.Tensor | None = None,
    codebook: torch.Tensor | None = None,
    x_scales: torch.Tensor | None = None,
    x_scale_at: int = NO_SCALE,
    tiles: dict | None = None,
) -> torch.Tensor:
    """y [M, N] in out_dtype; the public functions (kernels/quant_matmul.py) check the arguments. One token
    takes kernels/quant_gemv.py (tiles: its keys)."""
    num_tokens, num_in = x.shape
    if num_tokens == 1:
        return launch_quant_gemv(
            x, codes, num_out, fmt, out_dtype, w_scales=w_scales, w_scale_at=w_scale_at, w_group=w_group,
            w_row_div=w_row_div, zeros=zeros, codebook=codebook, x_scales=x_scales, x_scale_at=x_scale_at,
            tiles=tiles,
        )  # fmt: skip
    on_gpu = x.device.type == "cuda"
    fp8_chunked = fmt == FP8 and CHUNK_SCALE in (w_scale_at, x_scale_at)
    config = default_tiles(fmt, num_tokens, fp8_chunked, on_gpu)
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    config.update(tiles or {})
    block_m, block_k = config["BLOCK_M"], config["BLOCK_K"]
    if block_m < 16:
        raise ValueError(f"BLOCK_M must be at least 16 (tl.dot), got {block_m}")
    # fp8 products on the tensor cores; the interpreter (which has no fp8 dot) widens the codes to fp32
    dot_fp8 = fmt == FP8 and block_m >= 16 and not interpreting()
    if fp8_chunked and (block_k % FP8_SCALE_BLOCK or (dot_fp8 and block_k != FP8_SCALE_BLOCK)):
        need = "128" if dot_fp8 else "a multiple of 128"
        raise ValueError(f"BLOCK_K must be {need} (the fp8 scales' block along K), got {block_k}")
    if config["SPLIT_NIBBLES"] and fmt not in (INT4, NF4):
        raise ValueError("SPLIT_NIBBLES is for the 4-bit formats (int4, nf4)")
    y = torch.empty(num_tokens, num_out, device=x.device, dtype=out_dtype)
    if num_tokens == 0 or num_out == 0:
        return y
    if w_group >= num_in:  # one group (per channel): every chunk reads column 0, one compilation for every K
        w_group = PER_CHANNEL_GROUP
    if fp8_chunked:  # weight blocks and activation groups share the 128 columns
        scales_per_chunk = block_k // FP8_SCALE_BLOCK
    else:
        scales_per_chunk = max(1, block_k // w_group) if w_scale_at == CHUNK_SCALE else 1
    if fmt == FP8 and not dot_fp8:
        compute_dtype = dot_dtype(torch.float32)
    else:
        compute_dtype = dot_dtype(out_dtype)
    precision = dot_precision(torch.float32 if compute_dtype == tl.float32 else out_dtype)
    placeholder = codes
    grid = (triton.cdiv(num_tokens, block_m) * triton.cdiv(num_out, config["BLOCK_N"]),)
    _quant_gemm_kernel[grid](
        x, x_scales if x_scales is not None else placeholder, codes,
        w_scales if w_scales is not None else placeholder, zeros if zeros is not None else placeholder,
        codebook if codebook is not None else placeholder, y,
        num_tokens, num_out, num_in, x.stride(0),
        (x_scales.stride(0) if x_scales.shape[0] > 1 else 0) if x_scales is not None else 0,
        codes.stride(0),
        (w_scales.stride(0) if w_scales.shape[0] > 1 else 0) if w_scales is not None else 0,
        y.stride(0), w_scales.shape[1] if w_scales is not None else 1,
        FORMAT=fmt, W_SCALE=w_scale_at, W_GROUP=w_group, W_ROW_DIV=w_row_div, SCALES_PER_CHUNK=scales_per_chunk,
        HAS_ZEROS=zeros is not None, X_SCALE=x_scale_at, DOT_FP8=dot_fp8,
        DOT_DTYPE=compute_dtype, DOT_PRECISION=precision,
        **config, **pdl_options(x.device),
    )  # fmt: skip
    return y
