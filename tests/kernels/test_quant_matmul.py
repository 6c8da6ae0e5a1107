"""The quantized linear layers (kernels/quant_matmul.py) against their torch references: every format and
scale layout at 1, 3, 16 and 65+ tokens (the one-token, streaming and tensor-core tiles), widths off the
tiles, chunks holding several scale groups and groups spanning several chunks; the FP8 activation
quantization bit for bit; bad layouts refused naming the argument.

On the CPU these run through Triton's interpreter, which has no fp8 tl.dot: there the fp8 GEMM takes the
path that widens fp8 codes to fp32 (the GPU's fp8 tensor-core dot runs in test_quant_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from kernels.fp8_activations import quantize_fp8_activations, quantize_fp8_activations_ref
from kernels.quant_formats import FP8_MAX, NF4_CODEBOOK, pack_int4, random_quantized_weight, unpack_int4
from kernels.quant_gemm import STREAMING_MAX_TOKENS, default_tiles
from kernels.quant_matmul import (
    dense_matmul,
    dense_matmul_ref,
    fp8_matmul,
    fp8_matmul_ref,
    int4_matmul,
    int4_matmul_ref,
    int8_matmul,
    int8_matmul_ref,
    nf4_matmul,
    nf4_matmul_ref,
)

MATMULS = {
    "int8": (int8_matmul, int8_matmul_ref),
    "int4": (int4_matmul, int4_matmul_ref),
    "nf4": (nf4_matmul, nf4_matmul_ref),
    "fp8_block": (fp8_matmul, fp8_matmul_ref),
    "fp8_channel": (fp8_matmul, fp8_matmul_ref),
    "fp8_tensor": (fp8_matmul, fp8_matmul_ref),
}
# (format, N, K, group size, zero points): N and K off the 16-row / 64-column interpreter tiles where the
# format allows; groups of 32 (two a chunk), 64, 128 (two chunks a group) and per channel (K not a power of 2)
CASES = [
    ("int8", 37, 192, 64, False),
    ("int8", 29, 96, None, False),
    ("int4", 37, 192, 32, True),
    ("int4", 21, 256, 128, False),
    ("int4", 19, 192, 64, False),
    ("int4", 23, 96, None, True),
    ("nf4", 37, 192, None, False),
    ("fp8_block", 150, 300, None, False),
    ("fp8_channel", 37, 200, None, False),
    ("fp8_tensor", 19, 72, None, False),
]
TOKENS = [1, 3, 16, STREAMING_MAX_TOKENS + 3]


def _check(got: torch.Tensor, expected: torch.Tensor, num_in: int, fp8_dot: bool = False) -> None:
    """fp32 summation order; fp8_dot: a GPU's fp8 tensor cores, which accumulate a chunk's products in
    reduced precision (sm_90)."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    scale = max(float(expected.abs().max()), 1.0)
    if fp8_dot and got.is_cuda:
        torch.testing.assert_close(got, expected, atol=1e-3 * scale, rtol=1e-3)
    else:
        torch.testing.assert_close(got, expected, atol=2e-6 * num_in**0.5 * scale, rtol=1e-5)


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("fmt,num_out,num_in,group,zeros", CASES, ids=lambda v: str(v))
def test_every_format_matches_its_reference(fmt, num_out, num_in, group, zeros, num_tokens, device):
    matmul, reference = MATMULS[fmt]
    weight = random_quantized_weight(fmt, num_out, num_in, group, device, zeros=zeros)
    x = torch.randn(num_tokens, num_in, generator=torch.Generator().manual_seed(num_tokens)).to(device)
    _check(matmul(x, **weight), reference(x, **weight), num_in, fmt.startswith("fp8"))


@pytest.mark.parametrize("num_tokens", [1, 5, STREAMING_MAX_TOKENS + 1])
def test_fp8_with_a_static_activation_scale(num_tokens, device):
    weight = random_quantized_weight("fp8_channel", 33, 160, None, device)
    x = torch.randn(num_tokens, 160, device=device)
    input_scale = torch.tensor([float(x.abs().max()) / 300], device=device)  # a few values clamp at 448
    expected = fp8_matmul_ref(x, **weight, input_scale=input_scale)
    _check(fp8_matmul(x, **weight, input_scale=input_scale), expected, 160, fp8_dot=True)


@pytest.mark.parametrize(
    "tiles",
    [
        {"BLOCK_K": 128, "BLOCK_N": 8},  # four groups of 32 a chunk
        {"BLOCK_K": 16, "BLOCK_N": 32},  # a group of 32 spans two chunks
        {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2},  # grouped row blocks over 3 x 3 tiles
    ],
)
def test_int4_tiles_across_group_borders(tiles, device):
    weight = random_quantized_weight("int4", 40, 224, 32, device, zeros=True)
    for num_tokens in (1, 70) if tiles.get("BLOCK_M") != 32 else (70,):
        x = torch.randn(num_tokens, 224, device=device)
        run = {"CHUNK": 64, "BLOCK_N": 8} if num_tokens == 1 else tiles  # one token: two groups a step
        _check(int4_matmul(x, **weight, tiles=run), int4_matmul_ref(x, **weight), 224)


@pytest.mark.parametrize("split", [True, False], ids=["split-nibbles", "interleaved"])
@pytest.mark.parametrize("fmt", ["int4", "nf4"])
def test_both_4bit_unpackings(fmt, split, device):
    """The streaming tiles multiply low and high nibbles by x's even and odd columns, the tensor-core tiles
    interleave them back: each one forced at the other's token counts (one token: kernels/quant_gemv.py)."""
    weight = random_quantized_weight(fmt, 26, 256, 64 if fmt == "int4" else None, device, zeros=True)
    matmul, reference = MATMULS[fmt]
    for num_tokens in (5, 70):
        tiles = {"SPLIT_NIBBLES": split}
        x = torch.randn(num_tokens, 256, device=device)
        _check(matmul(x, **weight, tiles=tiles), reference(x, **weight), 256)


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_channel"])
def test_fp8_one_token_chunks_of_several_scale_blocks(fmt, device):
    """One token widens fp8 to fp32 and may take several 128-column scale blocks a chunk (the GPU's 1024)."""
    weight = random_quantized_weight(fmt, 140, 520, None, device)
    x = torch.randn(1, 520, device=device)
    _check(fp8_matmul(x, **weight, tiles={"CHUNK": 256, "BLOCK_N": 4}), fp8_matmul_ref(x, **weight), 520)


@pytest.mark.parametrize("fmt", ["int4", "fp8_block"])
def test_activation_rows_with_a_stride(fmt, device):
    """x as a view whose rows are further apart than K (a slice of a wider tensor)."""
    matmul, reference = MATMULS[fmt]
    weight = random_quantized_weight(fmt, 20, 256, 64 if fmt == "int4" else None, device)
    x = torch.randn(5, 300, device=device)[:, :256]
    for rows in (x[:1], x):
        _check(matmul(rows, **weight), reference(rows.contiguous(), **weight), 256, fmt.startswith("fp8"))


@pytest.mark.parametrize("num_tokens", [1, 7, 90])
def test_dense_streaming_matches_the_reference(num_tokens, device):
    w = torch.randn(45, 200, device=device) / 14
    x = torch.randn(num_tokens, 200, device=device)
    expected = dense_matmul_ref(x, w)
    _check(dense_matmul(x, w), expected, 200)  # 90 tokens: F.linear
    tile = {"CHUNK": 64} if num_tokens == 1 else {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32}
    _check(dense_matmul(x, w, tiles=tile), expected, 200)  # the kernel at every count


@pytest.mark.parametrize("num_tokens", [1, 16])
def test_bfloat16_activations_round_once(num_tokens, device):
    """bf16 x: the dequantized chunk rounds to bf16 before the dot (the reference keeps it fp32), then y."""
    weight = random_quantized_weight("int4", 24, 128, 64, device)
    x = torch.randn(num_tokens, 128, device=device).bfloat16()
    got = int4_matmul(x, **weight)
    expected = int4_matmul_ref(x, **weight)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_fp8_activation_quantization_is_bit_exact(device):
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(3)) * 3
    x[1] = 0.0  # an all-zero token: the floor scale, zero codes
    x[2, :128] = torch.linspace(-1, 1, 128) * 1e-4  # subnormal codes
    # values that round up across a power of two (124.3 -> 128): the carry into the exponent
    x[3, :4] = torch.tensor([447.0, 124.3, -31.4, 15.9])
    x = x.to(device)
    for group in (128, None):
        xq, scales = quantize_fp8_activations(x, group)
        ref_q, ref_scales = quantize_fp8_activations_ref(x, group)
        assert scales.shape == ((5, 3) if group else (5, 1))
        assert torch.equal(scales, ref_scales)
        assert torch.equal(xq.view(torch.uint8), ref_q.view(torch.uint8)), group
    static = torch.tensor([0.01], device=device)  # x / 0.01 clamps at +-448
    xq, scales = quantize_fp8_activations(x, input_scale=static)
    ref_q, _ = quantize_fp8_activations_ref(x, input_scale=static)
    assert scales.shape == (1, 1) and float(xq.float().abs().max()) == FP8_MAX
    assert torch.equal(xq.view(torch.uint8), ref_q.view(torch.uint8))


def test_int4_packing_and_the_nf4_codebook():
    codes = torch.randint(0, 16, (3, 10))
    packed = pack_int4(codes)
    assert packed.shape == (3, 5) and int(packed[0, 0]) == int(codes[0, 0]) | int(codes[0, 1]) << 4
    assert torch.equal(unpack_int4(packed), codes.int())
    assert len(NF4_CODEBOOK) == 16 and NF4_CODEBOOK[7] == 0.0 and NF4_CODEBOOK[0] == -1.0


def test_tiles_stream_the_weights_up_to_64_tokens():
    for num_tokens in (2, 17, 64):
        tile = default_tiles(2, num_tokens, False, on_gpu=True)
        assert tile["BLOCK_M"] >= num_tokens and tile["BLOCK_N"] == 16  # one row block: weights read once
    assert default_tiles(2, 65, False, on_gpu=True)["BLOCK_N"] == 128  # tensor-core tiles
    assert default_tiles(4, 300, True, on_gpu=True)["BLOCK_K"] == 128  # fp8 block scales fix the dot chunk


def test_bad_layouts_are_refused_naming_the_argument(device):
    x = torch.randn(2, 128, device=device)
    w8 = random_quantized_weight("int8", 8, 128, 64, device)
    with pytest.raises(ValueError, match="scales must be"):
        int8_matmul(x, w8["qweight"], w8["scales"][:, :1], 64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        int8_matmul(x, w8["qweight"], w8["scales"], 48)
    with pytest.raises(ValueError, match="qweight must be int8"):
        int8_matmul(x, w8["qweight"].to(torch.int16), w8["scales"], 64)
    w4 = random_quantized_weight("int4", 8, 96, None, device)
    with pytest.raises(ValueError, match="does not divide K=96"):
        int4_matmul(torch.randn(2, 96, device=device), w4["qweight"], w4["scales"].expand(8, 3).contiguous(), None, 64)
    with pytest.raises(ValueError, match="zeros must be"):
        int4_matmul(torch.randn(2, 96, device=device), w4["qweight"], w4["scales"], w4["scales"], 96)
    with pytest.raises(ValueError, match="x must be"):
        int4_matmul(x, **w4)
    with pytest.raises(ValueError, match="nf4 needs K a multiple of 64"):
        nf4_matmul(torch.randn(2, 96, device=device), w4["qweight"], w4["scales"])
    w_fp8 = random_quantized_weight("fp8_block", 8, 128, None, device)
    with pytest.raises(ValueError, match="weight_scale must be"):
        fp8_matmul(x, w_fp8["qweight"], torch.ones(2, 2, device=device))
    with pytest.raises(ValueError, match="input_scale must be one float32"):
        fp8_matmul(x, **w_fp8, input_scale=torch.ones(2, device=device))
    with pytest.raises(ValueError, match="x must be float16"):
        fp8_matmul(x.double(), **w_fp8)
    blocks = random_quantized_weight("fp8_block", 150, 300, None, device)
    with pytest.raises(ValueError, match="BLOCK_K must be"):
        fp8_matmul(torch.randn(2, 300, device=device), **blocks, tiles={"BLOCK_K": 64})
    with pytest.raises(ValueError, match="BLOCK_M must be at least 16"):
        int8_matmul(x, **w8, tiles={"BLOCK_M": 8})
    with pytest.raises(ValueError, match="SPLIT_NIBBLES is for the 4-bit formats"):
        int8_matmul(x, **w8, tiles={"SPLIT_NIBBLES": True})
    with pytest.raises(ValueError, match="tiles may set only"):
        int8_matmul(x, **w8, tiles={"BLOCK_Q": 8})
    with pytest.raises(ValueError, match="weight must be"):
        dense_matmul(x, torch.randn(8, 128, device=device).half())
