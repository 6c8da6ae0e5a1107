"""Quantized matrix-vector product for one token (batch-1 decode) in every weight format.

Legend: N = output features, K = input features, G = a scale's group along K (kernels/quant_formats.py's
layouts), Bn = BLOCK_N, CHUNK = the columns of one step, PER = the codes a stored unit holds.
    y [1, N] = x [1, K] W^T, W [N, K] = int8: q s; int4: (q - z) s; nf4: NF4_CODEBOOK[q] absmax;
    fp8: q scale, with x itself fp8 (kernels/fp8_activations.py) times its scales.
Math: fp32 products and sums, one rounding of y to its dtype. The products of one stored unit (a 32-bit
word of 8 4-bit or 4 int8 codes, or one code) are summed before its scale multiplies them: the
reference's terms ((q - z) s) x in another order.

Why a kernel of its own (decision 0070): at one token a projection streams its codes once, and a 4-bit
byte holds two weights, so the kernel runs out of instructions before it runs out of bandwidth: an H200
issues about 33 T lane-instructions a second against ~4.8 TB/s, 7 an int4 byte. What it does about it:
- codes are read as 32-bit words; each code becomes an fp32 in one AND-OR (int8: AND-XOR) and one
  subtraction that also takes off the zero point (_unit_values): no integer conversion, a quarter-rate
  instruction, and no shift a code;
- 16-bit x is read two columns a 32-bit word and split by one bit operation a value (_x_pairs);
- fp8 codes (and int8 codes whose rows do not start on a word) are read as elements, 8 (4) to a unit,
  through Triton's own conversion;
- a thread keeps each of its units' sums in its own registers and multiplies them by the unit's scale:
  no reduction across threads before the end, and no reshape of the tile (which moved the previous
  one-token tile's scales and x through shared memory every step);
- the first step's codes load before the PDL wait and each step issues the next one's before it computes
  (kernels/gemv.py's schedule); K a multiple of the step drops the masks along K.
Per-channel and per-tensor scales multiply the final sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._pdl import pdl_launch_dependents, pdl_options, pdl_wait

DENSE, INT8, INT4, NF4, FP8 = 0, 1, 2, 3, 4  # the formats' ids in every quantized kernel
NO_SCALE, CHUNK_SCALE, END_SCALE = 0, 1, 2  # where a scale applies: nowhere, along K (per group), to the sum
WHOLE_ROW = 1 << 30  # SCALE_W of one scale column for the whole row (per channel)
TILE_KEYS = ("BLOCK_N", "CHUNK", "num_warps")


@triton.jit
def _x_pairs(x_ptrs, in_k, X_PAIRS: tl.constexpr, EVEN_K: tl.constexpr):
    """x's columns 2p and 2p + 1 of the pairs p that x_ptrs point at, fp32: one 32-bit word split by one
    instruction a value (X_PAIRS; x viewed as int32, x_ptrs at the words), or two loads (x_ptrs at column 2p:
    x_ptr + 2p is the caller's, which then advances by whole columns)."""
    if X_PAIRS == 0:
        x_lo = tl.load(x_ptrs, mask=in_k, other=0.0).to(tl.float32)
        x_hi = tl.load(x_ptrs + 1, mask=in_k, other=0.0).to(tl.float32)
    else:
        if EVEN_K:
            word = tl.load(x_ptrs)
        else:
            word = tl.load(x_ptrs, mask=in_k, other=0)
        if X_PAIRS == 1:  # a bf16 is the upper half of the fp32 of the same value
            x_lo = (word << 16).to(tl.float32, bitcast=True)
            x_hi = (word & -65536).to(tl.float32, bitcast=True)
        else:
            x_lo = (word & 65535).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            x_hi = (word >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return x_lo, x_hi


@triton.jit
def _unit_values(units, inner, offset, codebook_ptr, zero, FORMAT: tl.constexpr, PER: tl.constexpr):
    """Packed units [Bn, U, 1] -> the codes at positions `inner` ([1, 1, P]) of each, [Bn, U, P] fp32
    before scales: int4's q - z (`offset`: z, [Bn, U, 1] or scalar), nf4's codebook value, int8's q.

    Words: a code at bits b..b+B-1 of a 32-bit word (b + B <= 20: the low half, or the high half shifted
    down once) is read as an fp32 by one AND-OR-XOR: the mantissa field m = code << b under the exponent
    23 - b gives 2^(23 - b) + code (int8: code + 128, its sign bit flipped), exact; one subtraction
    leaves the code itself. No integer conversion (a quarter-rate instruction), no shift a code."""
    # NOTE: one return: Triton checks every return's type, also under a constexpr `if`
    if PER >= 4:
        HALF: tl.constexpr = PER // 2  # codes in a half word
        BITS: tl.constexpr = 32 // PER
        half = (inner >= HALF).to(tl.int32)
        b = (inner % HALF) * BITS  # the code's first bit inside its half
        word = units >> (16 * half)  # the high half shifted down (the shift folds to one per half per word)
        # NOTE: `zero` is a kernel argument (0): the exponents stay in registers, so AND and OR (and XOR) are one
        # LOP3 (it takes one immediate: with both constants folded it is two instructions)
        exponent = ((150 - b) << 23) + zero  # the fp32 bits of 2^(23 - b)
        if FORMAT == 3:
            values = tl.load(codebook_ptr + ((word >> b) & 15))
        elif FORMAT == 1:
            flip = (exponent | (128 << b)) + zero  # the exponent and the sign bit's flip: one register
            bits = (word & (255 << b)) ^ flip
            values = bits.to(tl.float32, bitcast=True) - (exponent.to(tl.float32, bitcast=True) + 128.0)
        else:
            bits = (word & (15 << b)) | exponent
            values = bits.to(tl.float32, bitcast=True) - (exponent.to(tl.float32, bitcast=True) + offset)
    else:  # 4-bit bytes, k = 2j in byte j's low nibble
        nibbles = (units.to(tl.int32) >> (4 * inner)) & 15
        if FORMAT == 3:
            values = tl.load(codebook_ptr + nibbles)
        else:
            values = nibbles.to(tl.float32) - offset
    return values


@triton.jit
def _quant_gemv_kernel(
    x_ptr,  # [1, K]: model dtype, or fp8 codes (FORMAT fp8)
    xs_ptr,  # fp8 activation scales: [1, ceil(K / 128)] (X_SCALE chunk) or [1, 1] (X_SCALE end)
    w_ptr,  # the codes' stored units: rows of stride_w units (int32 words, or the codes' own elements)
    ws_ptr,  # weight scales / absmax, fp32, rows of stride_ws (0: one row for all)
    wz_ptr,  # int4 zero points uint8, rows of stride_ws (HAS_ZEROS)
    codebook_ptr,  # nf4: [16] fp32
    y_ptr,  # [1, N]
    N,
    K,
    stride_w,
    stride_ws,
    num_scale_cols,  # columns of the weight's scales (mask of the last chunk's)
    zero,  # 0 (_unit_values' NOTE)
    FORMAT: tl.constexpr,
    W_SCALE: tl.constexpr,
    W_ROW_DIV: tl.constexpr,  # rows per scale row: 1, or 128 for fp8 blocks
    HAS_ZEROS: tl.constexpr,
    X_SCALE: tl.constexpr,
    PER: tl.constexpr,  # codes a unit holds: 8 (4-bit word), 4 (int8 word), 2 (4-bit byte), or PER elements
    PACKED: tl.constexpr,  # a unit is one stored element packing PER codes, else PER stored elements of a code
    X_PAIRS: tl.constexpr,  # x read as int32 words of two 16-bit values: 1 bf16, 2 fp16; 0 element by element
    EVEN_K: tl.constexpr,  # K is a multiple of CHUNK: no masks along K
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,  # columns a step
    SCALE_W: tl.constexpr,  # columns a scale column covers (WHOLE_ROW: one column a row)
    PDL: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    U: tl.constexpr = CHUNK // PER  # units of a row a step
    STEP: tl.constexpr = U if PACKED else CHUNK  # stored elements of a row a step
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    n3 = n[:, None, None]
    units = tl.arange(0, U)[None, :, None]  # [1, U, 1] from the step's first
    j = tl.arange(0, PER // 2)[None, None, :]  # [1, 1, PER / 2] a packed unit's pairs of codes (even, odd)
    elems = tl.arange(0, PER)[None, None, :]  # [1, 1, PER] an element unit's codes
    # the stored elements of a step's units, from the step's first: [1, U, 1] packed, [1, U, PER] elements
    offs = units if PACKED else units * PER + elems
    num_stored = K // PER if PACKED else K
    row_mask = n_mask[:, None, None]
    # NOTE: pointers advance by a step each iteration (the loads' offsets stay constant immediates), where
    # base + (k0 + offsets) recomputed each element's 64-bit address: an instruction a code at int8
    w_ptrs = w_ptr + n3.to(tl.int64) * stride_w + offs
    if EVEN_K:
        units_next = tl.load(w_ptrs, mask=row_mask, other=0.0)
    else:
        units_next = tl.load(w_ptrs, mask=row_mask & (offs < num_stored), other=0.0)
    if PACKED:  # x's pair of columns of each pair of codes: the int32 word, or the first column
        x_ptrs = x_ptr + (units * (PER // 2) + j) * (1 if X_PAIRS else 2) + 0 * n3
    else:
        x_ptrs = x_ptr + units * PER + elems + 0 * n3
    ws_rows = ws_ptr + (n3 // W_ROW_DIV).to(tl.int64) * stride_ws  # [Bn, 1, 1]
    pdl_wait(PDL)  # x and its scales are the kernels' before

    # each unit's products summed over its PER weights, times the unit's scales: a thread's units never
    # leave it before the end (no reduction across threads a step)
    acc = tl.zeros((BLOCK_N, U, 1), dtype=tl.float32)
    for k0 in range(0, K, CHUNK):
        u = k0 // PER + units
        chunk_units = units_next
        w_ptrs += STEP
        if EVEN_K:  # the load after the last step would read the next row: masked off
            units_next = tl.load(w_ptrs, mask=row_mask & (k0 + CHUNK < K), other=0.0)
        else:
            nxt = (k0 // PER if PACKED else k0) + STEP + offs
            units_next = tl.load(w_ptrs, mask=row_mask & (nxt < num_stored), other=0.0)
        col = u * PER // SCALE_W  # each unit's scale column ([1, U, 1]; a unit never spans two groups)
        c_mask = row_mask & (col < num_scale_cols)
        if FORMAT == 2 and HAS_ZEROS:
            offset = tl.load(wz_ptr + n3.to(tl.int64) * stride_ws + col, mask=c_mask, other=0).to(tl.float32)
        else:
            offset = 8.0
        # x in the weights' layout: every row of the tile reads the same addresses (L1 hits), where a [1, ...]
        # tile would be moved into the weights' layout through shared memory (kernels/gemv.py's x_tile)
        if PACKED:
            in_k = (u * (PER // 2) + j + 0 * n3) < K // 2
            x_lo, x_hi = _x_pairs(x_ptrs, in_k, X_PAIRS, EVEN_K)
            v_lo = _unit_values(chunk_units, 2 * j, offset, codebook_ptr, zero, FORMAT, PER)
            v_hi = _unit_values(chunk_units, 2 * j + 1, offset, codebook_ptr, zero, FORMAT, PER)
            part = tl.sum(v_lo * x_lo + v_hi * x_hi, axis=2, keep_dims=True)
            x_ptrs += CHUNK // 2 if X_PAIRS else CHUNK
        else:
            if EVEN_K:
                xk = tl.load(x_ptrs).to(tl.float32)
            else:
                xk = tl.load(x_ptrs, mask=(u * PER + elems + 0 * n3) < K, other=0.0).to(tl.float32)
            part = tl.sum(chunk_units.to(tl.float32) * xk, axis=2, keep_dims=True)
            x_ptrs += CHUNK
        if W_SCALE == 1:
            part *= tl.load(ws_rows + col, mask=c_mask, other=0.0)
        if X_SCALE == 1:
            part *= tl.load(xs_ptr + col + 0 * n3, mask=c_mask, other=0.0)
        acc += part
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    if W_SCALE == 2:
        y *= tl.load(ws_ptr + (n // W_ROW_DIV).to(tl.int64) * stride_ws, mask=n_mask, other=0.0)
    if X_SCALE == 2:
        y *= tl.load(xs_ptr)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv_tiles(fmt: int, on_gpu: bool, num_out: int = 0, num_in: int = 0, per_channel: bool = False) -> dict:
    """A program's rows (BLOCK_N), the columns of its step (CHUNK) and its warps, by format and shape, from two
    sweeps of one-token tiles on the H200 at the Llama-3.1-8B shapes (2026-11-29; the second a grid of rows 2..16,
    three steps and 4 or 8 warps, decision 0072):
    - the base: 4 rows a program, 1,024 columns a step (nf4 2,048); 4 warps for int8 and int4, 8 for fp8 and
      nf4; int4 had 2,048 columns before the grid (gate|up 46.8 -> 42.1 us, qkv 11.9 -> 11.1 at 1,024);
    - int8 and int4 rows of at least 8,192 columns (down): 2 rows and 2,048 columns a step (int8 23.7 -> 18.9 us,
      int4 23.9 -> 22.5): twice the programs, each with twice the bytes a row in flight;
    - int8 of at most 4,096 output rows (o): 8 rows a program (9.0 -> 7.6 us): x read from L2 half as often;
    - fp8 with per-channel scales: 2 rows and 4 warps (qkv 13.4 -> 12.4, gate|up 42.1 -> 40.7; o and down
      within 0.3 us). fp8 blocks and nf4 keep the base (not swept again).
    The interpreter takes small steps (its CPU time grows with the tile)."""
    if not on_gpu:
        return dict(BLOCK_N=4, CHUNK=64, num_warps=1)
    tile = dict(BLOCK_N=4, CHUNK=2048 if fmt == NF4 else 1024, num_warps=4 if fmt in (INT4, INT8) else 8)
    if fmt in (INT4, INT8) and num_in >= 8192:
        tile.update(BLOCK_N=2, CHUNK=2048)
    elif fmt == INT8 and 0 < num_out <= 4096:
        tile.update(BLOCK_N=8)
    elif fmt == FP8 and per_channel:
        tile.update(BLOCK_N=2, num_warps=4)
    return tile


def stored_units(codes: torch.Tensor, fmt: int, scale_w: int) -> tuple[torch.Tensor, int, bool]:
    """(the codes as the kernel reads them, the codes a unit holds, whether a unit is packed). Packed: int32
    words of 8 4-bit or 4 int8 codes where every row starts on a word and a scale group (scale_w columns)
    covers whole words, else 4-bit bytes (2 codes). Not packed: 8 fp8 (or 4 int8) codes as their own
    elements, whose scales a unit looks up once (fp8's conversion takes the codes one by one)."""
    four_bit = fmt in (INT4, NF4)
    per_word = 8 if four_bit else 4
    row_bytes = codes.shape[1] * codes.element_size()
    aligned = row_bytes % 4 == 0 and codes.data_ptr() % 4 == 0 and codes.is_contiguous()
    if fmt in (INT4, NF4, INT8) and aligned and scale_w % per_word == 0:
        return codes.view(torch.int32), per_word, True
    if four_bit:
        return codes, 2, True
    return codes, 8 if fmt in (FP8, DENSE) else 4, False


def launch_quant_gemv(
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
    """y [1, N] in out_dtype for x [1, K]; the public functions (kernels/quant_matmul.py) check the arguments
    (the same as kernels/quant_gemm.py's launch_quant_gemm). tiles: BLOCK_N, CHUNK (columns a step: a power
    of two; any against the scale groups, each unit finds its own scale), num_warps."""
    num_in = x.shape[1]
    config = gemv_tiles(fmt, x.device.type == "cuda", num_out, num_in, per_channel=w_scale_at == END_SCALE)
    unknown = set(tiles or {}) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TILE_KEYS}, got {sorted(unknown)}")
    config.update(tiles or {})
    chunk = config.pop("CHUNK")
    if chunk < 8 or chunk & (chunk - 1):
        raise ValueError(f"CHUNK must be a power of two of at least 8 (a step of whole 32-bit words), got {chunk}")
    y = torch.empty(1, num_out, device=x.device, dtype=out_dtype)
    if num_out == 0:
        return y
    scale_w = w_group if CHUNK_SCALE in (w_scale_at, x_scale_at) and w_group < num_in else WHOLE_ROW
    units, per, packed = stored_units(codes, fmt, scale_w)
    x_pairs = 0
    if packed and x.dtype in (torch.bfloat16, torch.float16) and x.is_contiguous() and x.data_ptr() % 4 == 0:
        x_pairs = 1 if x.dtype == torch.bfloat16 else 2
        x = x.view(torch.int32)
    placeholder = codes
    _quant_gemv_kernel[(triton.cdiv(num_out, config["BLOCK_N"]),)](
        x, x_scales if x_scales is not None else placeholder, units,
        w_scales if w_scales is not None else placeholder, zeros if zeros is not None else placeholder,
        codebook if codebook is not None else placeholder, y,
        num_out, num_in, units.stride(0),
        (w_scales.stride(0) if w_scales.shape[0] > 1 else 0) if w_scales is not None else 0,
        w_scales.shape[1] if w_scales is not None else 1, 0,
        FORMAT=fmt, W_SCALE=w_scale_at, W_ROW_DIV=w_row_div, HAS_ZEROS=zeros is not None, X_SCALE=x_scale_at,
        PER=per, PACKED=packed, X_PAIRS=x_pairs, EVEN_K=num_in % chunk == 0, CHUNK=chunk, SCALE_W=scale_w,
        num_stages=1, **config, **pdl_options(x.device),
    )  # fmt: skip
    return y
