"""The quantized linear layers on a CUDA GPU at the Llama-3.1-8B and Llama-3.2-1B projection shapes, bf16
activations, every tile the GPU takes (one token, the streaming tiles, the tensor-core tiles and
torch._scaled_mm), the fp8 tensor-core dot included (GPU only; skipped elsewhere: the CPU tests run the
interpreter's small tiles and its fp32 fp8 path)."""

from __future__ import annotations

import pytest
import torch

from kernels.fp8_activations import quantize_fp8_activations, quantize_fp8_activations_ref
from kernels.quant_formats import random_quantized_weight
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
    supports_fp8,
    uses_scaled_mm,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (N, K): 8B qkv, 8B down, 1B gate_up, 1B o
SHAPES = [(6144, 4096), (4096, 14336), (16384, 2048), (2048, 2048)]
TOKENS = [1, 2, 16, 64, 65, 256]
FORMATS = [
    ("int8", None, False, int8_matmul, int8_matmul_ref),
    ("int8", 128, False, int8_matmul, int8_matmul_ref),
    ("int4", 128, True, int4_matmul, int4_matmul_ref),
    ("int4", 32, False, int4_matmul, int4_matmul_ref),
    ("nf4", None, False, nf4_matmul, nf4_matmul_ref),
    ("fp8_block", None, False, fp8_matmul, fp8_matmul_ref),
    ("fp8_channel", None, False, fp8_matmul, fp8_matmul_ref),
    ("fp8_tensor", None, False, fp8_matmul, fp8_matmul_ref),
]


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


# NOTE: ids name the format and its group: a function's default id holds its address, which differs between
# pytest-xdist's workers (their collections must agree)
@pytest.mark.parametrize(
    "fmt,group,zeros,matmul,reference", FORMATS, ids=[f"{f[0]}-g{f[1]}-{'zeros' if f[2] else 'sym'}" for f in FORMATS]
)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_real_shapes_match_the_reference_in_bf16(shape, fmt, group, zeros, matmul, reference):
    if fmt.startswith("fp8") and not supports_fp8(torch.device("cuda")):
        pytest.skip("fp8 needs compute capability 8.9")
    num_out, num_in = shape
    weight = random_quantized_weight(fmt, num_out, num_in, group, torch.device("cuda"), zeros=zeros)
    for num_tokens in TOKENS:
        x = torch.randn(num_tokens, num_in, device="cuda").bfloat16()
        got = matmul(x, **weight)
        assert got.dtype == torch.bfloat16 and got.shape == (num_tokens, num_out)
        # one rounding of each dequantized weight to bf16 before the dot, one of y
        assert relative_error(got, reference(x, **weight)) < 1e-2, num_tokens


def test_fp8_large_steps_take_scaled_mm_for_channel_scales():
    weight = random_quantized_weight("fp8_channel", 4096, 4096, None, torch.device("cuda"))
    x = torch.randn(300, 4096, device="cuda").bfloat16()
    assert uses_scaled_mm(x, weight["qweight"], weight["weight_scale"])
    assert not uses_scaled_mm(x[:64], weight["qweight"], weight["weight_scale"])
    block = random_quantized_weight("fp8_block", 4096, 4096, None, torch.device("cuda"))
    assert not uses_scaled_mm(x, block["qweight"], block["weight_scale"])
    # the Triton kernel's tensor-core tiles and _scaled_mm agree
    forced = fp8_matmul(x, **weight, tiles={"BLOCK_M": 128})
    assert relative_error(fp8_matmul(x, **weight), forced) < 1e-2


@pytest.mark.parametrize("num_tokens", [1, 8, 64])
def test_dense_streaming_matches_linear(num_tokens):
    w = (torch.randn(6144, 4096, device="cuda") / 64).bfloat16()
    x = torch.randn(num_tokens, 4096, device="cuda").bfloat16()
    assert relative_error(dense_matmul(x, w), dense_matmul_ref(x, w)) < 1e-2


def test_graph_replay_reads_new_activations():
    """Captured once, a replay computes from what the input buffer holds then (the engine's decode graphs)."""
    weight = random_quantized_weight("int4", 4096, 4096, 128, torch.device("cuda"), zeros=True)
    x = torch.randn(8, 4096, device="cuda").bfloat16()
    int4_matmul(x, **weight)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = int4_matmul(x, **weight)
    x.copy_(torch.randn(8, 4096, device="cuda").bfloat16())
    graph.replay()
    assert relative_error(y, int4_matmul_ref(x, **weight)) < 1e-2


@pytest.mark.parametrize("group", [128, None], ids=["groups", "per-token"])
def test_fp8_activation_codes_equal_the_reference_bit_for_bit(group):
    """The GPU's rounding division and fp8 cast against torch's, on bf16 activations of a real width."""
    if not supports_fp8(torch.device("cuda")):
        pytest.skip("fp8 needs compute capability 8.9")
    x = (torch.randn(64, 4096, device="cuda") * torch.logspace(-3, 2, 4096, device="cuda")).bfloat16()
    xq, scales = quantize_fp8_activations(x, group)
    ref_q, ref_scales = quantize_fp8_activations_ref(x, group)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(xq.view(torch.uint8), ref_q.view(torch.uint8))
