"""The one-token quantized GEMV (kernels/quant_gemv.py) against the formats' torch references: codes read as
32-bit words and as their own elements, x read as 16-bit pairs and element by element, K a multiple of the
step and not, the magic-number decoding exact at the codes' and zero points' extremes, and its tiles refused
that are not whole words. (Every format at one token also runs in test_quant_matmul.py.)"""

from __future__ import annotations

import pytest
import torch

from kernels.quant_formats import pack_int4, random_quantized_weight
from kernels.quant_gemv import INT4, INT8, NF4, stored_units
from kernels.quant_matmul import (
    fp8_matmul,
    fp8_matmul_ref,
    int4_matmul,
    int4_matmul_ref,
    int8_matmul,
    int8_matmul_ref,
    nf4_matmul,
    nf4_matmul_ref,
)

MATMULS = {  # a format's public matmul and its reference
    "int4": (int4_matmul, int4_matmul_ref),
    "int8": (int8_matmul, int8_matmul_ref),
    "nf4": (nf4_matmul, nf4_matmul_ref),
    "fp8_channel": (fp8_matmul, fp8_matmul_ref),
}


def _close(got: torch.Tensor, expected: torch.Tensor, num_in: int) -> None:
    scale = max(float(expected.abs().max()), 1.0)
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=2e-6 * num_in**0.5 * scale, rtol=1e-5)
    else:  # one rounding of y to 16 bits, after an fp32 sum in another order
        torch.testing.assert_close(got.float(), expected.float(), atol=1e-2 * scale, rtol=1e-2)


@pytest.mark.parametrize(
    "fmt,num_in,group,words",
    [
        ("int4", 192, 64, True),  # 96 bytes a row: words of 8 codes
        ("int4", 108, None, False),  # 54 bytes a row: bytes of 2 codes
        ("int8", 192, 32, True),
        ("int8", 102, None, False),
        ("nf4", 128, None, True),
    ],
)
def test_codes_as_words_and_as_elements(fmt, num_in, group, words, device):
    weight = random_quantized_weight(fmt, 21, num_in, group, device, zeros=fmt == "int4")
    ids = {"int4": INT4, "int8": INT8, "nf4": NF4}
    _, per, packed = stored_units(weight["qweight"], ids[fmt], group or num_in)
    assert (packed and per >= 4) == words
    matmul, reference = MATMULS[fmt]
    x = torch.randn(1, num_in, device=device)
    _close(matmul(x, **weight), reference(x, **weight), num_in)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_in", [256, 160], ids=["K-multiple-of-step", "K-off-step"])
def test_x_as_16_bit_pairs_and_element_by_element(dtype, num_in, device):
    """bf16 and fp16 x are read two columns a 32-bit word (split by bit operations), fp32 one by one; K both
    a multiple of the step (no masks along K) and not."""
    weight = random_quantized_weight("int4", 19, num_in, 32, device, zeros=True)
    x = torch.randn(1, num_in, device=device).to(dtype)
    got = int4_matmul(x, **weight, tiles={"CHUNK": 128})
    assert got.dtype == dtype
    _close(got, int4_matmul_ref(x, **weight), num_in)


def test_x_off_a_word_boundary_is_read_element_by_element(device):
    """A bf16 row starting 2 bytes into a word cannot be read as pairs."""
    weight = random_quantized_weight("int4", 9, 128, 64, device)
    x = torch.randn(1, 129, device=device).bfloat16()[:, 1:]
    assert x.data_ptr() % 4 == 2
    _close(int4_matmul(x, **weight), int4_matmul_ref(x.contiguous(), **weight), 128)


def test_decoding_is_exact_at_the_codes_and_zero_points_extremes(device):
    """Integer x, unit scales: y is an integer sum that fp32 holds exactly, so any off-by-one in the
    magic-number decoding of codes 0 and 15 (int4 zero points 0 and 15) or -128 and 127 (int8) shows."""
    num_out, num_in = 8, 256
    gen = torch.Generator().manual_seed(5)
    extremes = torch.tensor([0, 15])[torch.randint(0, 2, (num_out, num_in), generator=gen)]
    zeros = torch.tensor([0, 15], dtype=torch.uint8)[torch.randint(0, 2, (num_out, num_in // 32), generator=gen)]
    x = torch.randint(-3, 4, (1, num_in), generator=gen).float().to(device)
    int4 = {"qweight": pack_int4(extremes).to(device), "scales": torch.ones(num_out, num_in // 32, device=device),
            "zeros": zeros.to(device), "group_size": 32}  # fmt: skip
    assert torch.equal(int4_matmul(x, **int4), int4_matmul_ref(x, **int4))
    int4["zeros"] = None  # symmetric: zero point 8
    assert torch.equal(int4_matmul(x, **int4), int4_matmul_ref(x, **int4))
    codes = torch.tensor([-128, 127, -1, 0], dtype=torch.int8)[torch.randint(0, 4, (num_out, num_in), generator=gen)]
    int8 = {"qweight": codes.to(device), "scales": torch.ones(num_out, 1, device=device), "group_size": num_in}
    assert torch.equal(int8_matmul(x, **int8), int8_matmul_ref(x, **int8))


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_channel", "fp8_tensor"])
def test_fp8_codes_one_by_one_with_their_activation_scales(fmt, device):
    weight = random_quantized_weight(fmt, 150, 384, None, device)
    x = torch.randn(1, 384, device=device)
    _close(fp8_matmul(x, **weight, tiles={"CHUNK": 256}), fp8_matmul_ref(x, **weight), 384)


def test_nf4_step_of_several_absmax_blocks(device):
    weight = random_quantized_weight("nf4", 13, 384, None, device)
    x = torch.randn(1, 384, device=device)
    _close(nf4_matmul(x, **weight, tiles={"CHUNK": 256, "BLOCK_N": 2}), nf4_matmul_ref(x, **weight), 384)


def test_a_step_narrower_than_a_scale_group_and_bad_tiles(device):
    """Each unit finds its own scale, so a step may be narrower than a group; a step must be whole words."""
    weight = random_quantized_weight("int4", 8, 256, 128, device)
    x = torch.randn(1, 256, device=device)
    _close(int4_matmul(x, **weight, tiles={"CHUNK": 64}), int4_matmul_ref(x, **weight), 256)
    with pytest.raises(ValueError, match="CHUNK must be a power of two"):
        int4_matmul(x, **weight, tiles={"CHUNK": 96})
    with pytest.raises(ValueError, match="tiles may set only"):
        int4_matmul(x, **weight, tiles={"BLOCK_K": 64})


@pytest.mark.parametrize(
    "fmt,num_in,group,zeros",
    [("int8", 192, 64, False), ("int8", 100, None, False), ("int4", 224, 32, True), ("int4", 256, 128, False),
     ("nf4", 192, None, False)],
)  # fmt: skip
def test_whole_weight_dequantization_for_compute_bound_steps(fmt, num_in, group, zeros, device):
    """kernels/quant_dequant.py (above 64 tokens on a GPU, then cuBLAS) against the formats' torch
    dequantization, rounded once to the model's dtype; widths off its 128-column tiles."""
    from kernels.quant_dequant import dequantize
    from kernels.quant_formats import NF4_BLOCK, NF4_CODEBOOK, dequantize_int4, dequantize_int8, dequantize_nf4

    weight = random_quantized_weight(fmt, 45, num_in, group, device, zeros=zeros)
    if fmt == "int8":
        got = dequantize(weight["qweight"], INT8, num_in, weight["scales"], weight["group_size"], torch.float32)
        expected = dequantize_int8(weight["qweight"], weight["scales"], weight["group_size"])
    elif fmt == "int4":
        got = dequantize(weight["qweight"], INT4, num_in, weight["scales"], weight["group_size"], torch.float32,
                         zeros=weight["zeros"])  # fmt: skip
        expected = dequantize_int4(weight["qweight"], weight["scales"], weight["zeros"], weight["group_size"])
    else:
        codebook = torch.tensor(NF4_CODEBOOK, device=device)
        got = dequantize(weight["qweight"], NF4, num_in, weight["absmax"], NF4_BLOCK, torch.float32, codebook=codebook)
        expected = dequantize_nf4(weight["qweight"], weight["absmax"])
    assert torch.equal(got, expected.float())
    if device.type != "cuda":
        return  # NOTE: Triton 3.6's interpreter casts fp32 to bf16 by truncation; the GPU rounds to nearest even
    halves = dequantize(weight["qweight"], {"int8": INT8, "int4": INT4, "nf4": NF4}[fmt], num_in,
                        weight.get("scales", weight.get("absmax")), weight.get("group_size", NF4_BLOCK),
                        torch.bfloat16, zeros=weight.get("zeros"),
                        codebook=torch.tensor(NF4_CODEBOOK, device=device))  # fmt: skip
    assert torch.equal(halves, expected.to(torch.bfloat16))


@pytest.mark.parametrize(
    "fmt,num_out,num_in,per_channel,tile",
    [
        ("int8", 4096, 14336, False, dict(BLOCK_N=2, CHUNK=2048, num_warps=4)),  # down: long rows
        ("int4", 4096, 14336, False, dict(BLOCK_N=2, CHUNK=2048, num_warps=4)),
        ("int8", 4096, 4096, False, dict(BLOCK_N=8, CHUNK=1024, num_warps=4)),  # o: few output rows
        ("int8", 28672, 4096, False, dict(BLOCK_N=4, CHUNK=1024, num_warps=4)),  # gate|up: the base
        ("int4", 28672, 4096, False, dict(BLOCK_N=4, CHUNK=1024, num_warps=4)),
        ("fp8", 6144, 4096, True, dict(BLOCK_N=2, CHUNK=1024, num_warps=4)),  # per-channel fp8
        ("fp8", 6144, 4096, False, dict(BLOCK_N=4, CHUNK=1024, num_warps=8)),  # fp8 blocks: the base
        ("nf4", 6144, 4096, False, dict(BLOCK_N=4, CHUNK=2048, num_warps=8)),
    ],
)
def test_the_gpu_tile_follows_the_format_and_shape(fmt, num_out, num_in, per_channel, tile):
    """The sweep's tiles (decision 0072) by format and shape; the interpreter keeps its small step."""
    from kernels.quant_gemv import FP8, gemv_tiles

    ids = {"int4": INT4, "int8": INT8, "nf4": NF4, "fp8": FP8}
    assert gemv_tiles(ids[fmt], True, num_out, num_in, per_channel) == tile
    assert gemv_tiles(ids[fmt], False, num_out, num_in, per_channel) == dict(BLOCK_N=4, CHUNK=64, num_warps=1)


@pytest.mark.parametrize(
    "fmt,tile",
    [("int8", dict(BLOCK_N=2, CHUNK=2048)), ("int4", dict(BLOCK_N=2, CHUNK=2048)), ("int8", dict(BLOCK_N=8)),
     ("fp8_channel", dict(BLOCK_N=2))],
)  # fmt: skip
def test_the_gpu_tiles_give_the_reference_on_a_shape_they_do_not_divide(fmt, tile, device):
    """The GPU's row counts and steps on an odd row count and a K of one and a half steps (masks on both)."""
    chunk = tile.get("CHUNK", 1024)
    num_in = chunk + chunk // 2
    group = None if fmt in ("int8", "fp8_channel") else 128
    weight = random_quantized_weight(fmt, 2 * tile["BLOCK_N"] + 1, num_in, group, device)
    matmul, reference = MATMULS[fmt]
    x = torch.randn(1, num_in, device=device)
    _close(matmul(x, **weight, tiles={**tile, "CHUNK": chunk}), reference(x, **weight), num_in)
