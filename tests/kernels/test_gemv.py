"""The one-token projection kernel against F.linear in fp32 math: odd sizes that cross the row and
column tiles, a bias, bad input refused, and the engine's dispatch (engine.ops)."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from kernels._pdl import use_pdl
from kernels.gemv import TILE, WIDE_TILE, gemv, gemv_ref, gemv_tiles

ON_GPU = torch.cuda.is_available()
# (N out, K in): a single output, sizes off the 4-row / 512-column tiles, K below one tile
SHAPES = [(1, 8), (37, 300), (130, 513), (64, 1100)]
if ON_GPU:  # the Llama-3.1-8B / 3.2-1B projections at one token, lm_head included
    SHAPES += [(6144, 4096), (4096, 14336), (28672, 4096), (128256, 2048), (2048, 8192)]
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]


def _tolerance(dtype: torch.dtype, reference: torch.Tensor, num_in: int) -> dict:
    """fp32: the sum in another order; 16-bit: one rounding of the output (the interpreter truncates)."""
    scale = float(reference.abs().max())
    if dtype == torch.float32:
        return dict(atol=1e-6 * num_in**0.5 * max(scale, 1.0), rtol=1e-5)
    return dict(atol=2 * torch.finfo(dtype).eps * scale, rtol=2 * torch.finfo(dtype).eps)


# the launcher's pick for the shape, and both schedules forced: one chunk in flight, or wide chunks
# with two more in flight (the loads past K masked: K below one chunk, K just over one or two)
SCHEDULES = [
    pytest.param(None, id="launcher"),
    pytest.param(TILE, id="one-in-flight"),
    pytest.param(WIDE_TILE, id="wide-prefetch"),
    pytest.param({**WIDE_TILE, "BLOCK_N": 2, "num_warps": 4}, id="wide-2-rows"),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gemv_matches_linear(shape, with_bias, dtype, schedule, device):
    num_out, num_in = shape
    x = torch.randn(1, num_in, device=device).to(dtype)
    weight = (torch.randn(num_out, num_in, device=device) / num_in**0.5).to(dtype)
    bias = torch.randn(num_out, device=device).to(dtype) if with_bias else None
    # the reference in fp32 from the same rounded inputs
    expected = gemv_ref(x.float(), weight.float(), bias.float() if bias is not None else None)
    got = gemv(x, weight, bias, tiles=schedule)
    assert got.shape == (1, num_out) and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, **_tolerance(dtype, expected, num_in))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp32_output_is_the_rounded_result_widened(dtype, device):
    """out_dtype=fp32 (the LM head's logits): what F.linear(...).float() gives, the result rounded to x's
    dtype and then widened, with no cast kernel: bit for bit the 16-bit output widened."""
    num_out, num_in = (128256, 2048) if ON_GPU else (70, 600)
    x = torch.randn(1, num_in, device=device).to(dtype)
    weight = (torch.randn(num_out, num_in, device=device) / num_in**0.5).to(dtype)
    wide = gemv(x, weight, out_dtype=torch.float32)
    assert wide.dtype == torch.float32
    assert torch.equal(wide, gemv(x, weight).float())
    expected = gemv_ref(x.float(), weight.float())
    torch.testing.assert_close(wide, expected, **_tolerance(dtype, expected, num_in))
    if ops.uses_gemv(x, weight):  # the engine's LM head takes the kernel (on CUDA)
        assert torch.equal(ops.linear(x, weight, out_dtype=torch.float32), wide)
    with pytest.raises(ValueError, match="out_dtype must be a floating dtype"):
        gemv(x, weight, out_dtype=torch.int32)


def test_gemv_refuses_what_it_does_not_do(device):
    weight = torch.randn(8, 16, device=device)
    with pytest.raises(ValueError, match="single token"):
        gemv(torch.randn(2, 16, device=device), weight)
    with pytest.raises(ValueError, match="needs K"):
        gemv(torch.randn(1, 12, device=device), weight)
    with pytest.raises(ValueError, match="dtype"):
        gemv(torch.randn(1, 16, device=device), weight.to(torch.bfloat16))
    with pytest.raises(ValueError, match="bias"):
        gemv(torch.randn(1, 16, device=device), weight, torch.randn(9, device=device))
    with pytest.raises(ValueError, match="tiles may set only"):
        gemv(torch.randn(1, 16, device=device), weight, tiles={"BLOCK_M": 8})


def test_gemv_takes_the_wide_prefetching_step_only_where_programs_are_few():
    # an H100's 132 SMs: the 1B model's 2048-row projections (512 programs) take it, 3072 rows do not
    assert gemv_tiles(2048, 132) == WIDE_TILE and WIDE_TILE["PREFETCH"] and WIDE_TILE["BLOCK_K"] == 1024
    assert gemv_tiles(3072, 132) == TILE and not TILE["PREFETCH"]
    assert gemv_tiles(4096, 132)["PREFETCH"] is False
    assert gemv_tiles(8, 0)["PREFETCH"] is False  # the interpreter (no SMs): the plain step


def test_ops_dispatch_one_token_and_large_weights_to_the_kernel(device):
    least = ops.gemv_min_features(device)
    assert least == (ops.GEMV_MIN_FEATURES_PDL if use_pdl(device) else ops.GEMV_MIN_FEATURES)
    big = torch.empty(least, least, device=device)
    narrow = torch.empty(least // 2, least, device=device)
    one = torch.empty(1, least, device=device)
    three = torch.empty(3, least, device=device)
    with ops.kernel_backend("triton"):
        assert ops.uses_gemv(one, big)
        assert not ops.uses_gemv(three, big)  # a matmul: cuBLAS
        assert not ops.uses_gemv(one, narrow)  # measured slower in the engine at these sizes
    with ops.kernel_backend("torch"):
        assert not ops.uses_gemv(one, big)


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_ops_linear_agrees_across_backends(num_tokens, device, monkeypatch):
    """engine.ops.linear through the kernel (threshold lowered to these small sizes) and through F.linear."""
    monkeypatch.setattr(ops, "GEMV_MIN_FEATURES", 32)
    monkeypatch.setattr(ops, "GEMV_MIN_FEATURES_PDL", 32)  # the threshold where kernels launch with PDL
    x = torch.randn(num_tokens, 96, device=device)
    weight, bias = torch.randn(40, 96, device=device) / 10, torch.randn(40, device=device)
    with ops.kernel_backend("triton"):
        assert ops.uses_gemv(x, weight) == (num_tokens == 1)
        fast = ops.linear(x, weight, bias)
    with ops.kernel_backend("torch"):
        slow = ops.linear(x, weight, bias)
    torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)
