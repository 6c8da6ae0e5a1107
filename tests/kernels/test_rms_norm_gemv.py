"""RMSNorm fused into the one-token projection (and SwiGLU after it) against the unfused layer: the
fp32 math of the reference on the same rounded inputs, odd sizes across the row and column tiles,
with and without a residual, bias and SwiGLU; the new residual as x + residual rounded once; bad input
refused; and the engine's dispatch (engine.ops.rms_norm_linear)."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from kernels.rms_norm_gemv import rms_norm_gemv, rms_norm_gemv_ref
from tests.kernels.one_token_tolerance import one_token_tolerance

ON_GPU = torch.cuda.is_available()
EPS = 1e-5
# (N out, K in): a single row pair, sizes off the 8-row and 512-column tiles, K below one tile
SHAPES = [(2, 8), (38, 300), (130, 513), (64, 1100)]
if ON_GPU:  # Llama-3.1-8B qkv / gate|up, Llama-3.2-1B qkv / gate|up at one token
    SHAPES += [(6144, 4096), (28672, 4096), (3072, 2048), (16384, 2048)]
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]


def _inputs(num_out: int, num_in: int, dtype: torch.dtype, device, *, residual: bool, bias: bool):
    x = torch.randn(1, num_in, device=device).to(dtype)
    res = (3 * torch.randn(1, num_in, device=device)).to(dtype) if residual else None
    norm_weight = (1 + 0.3 * torch.randn(num_in, device=device)).to(dtype)
    weight = (torch.randn(num_out, num_in, device=device) / num_in**0.5).to(dtype)
    b = torch.randn(num_out, device=device).to(dtype) if bias else None
    return x, res, norm_weight, weight, b


def _fp32_reference(x, res, norm_weight, weight, bias, swiglu):
    """The unfused layer in fp32 on the kernel's inputs, with h rounded as the kernel rounds it."""
    h = x if res is None else (x.float() + res.float()).to(x.dtype)
    as32 = lambda t: t.float() if t is not None else None  # noqa: E731
    y, _ = rms_norm_gemv_ref(h.float(), None, norm_weight.float(), EPS, weight.float(), as32(bias), swiglu=swiglu)
    return y, h


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["nores", "residual"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_gemv_matches_the_unfused_layer(shape, with_residual, swiglu, dtype, device):
    num_out, num_in = shape
    x, res, norm_weight, weight, bias = _inputs(num_out, num_in, dtype, device, residual=with_residual, bias=True)
    expected, h = _fp32_reference(x, res, norm_weight, weight, bias, swiglu)
    got, new_residual = rms_norm_gemv(x, res, norm_weight, EPS, weight, bias, swiglu=swiglu)
    assert got.shape == (1, num_out // 2 if swiglu else num_out) and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, **one_token_tolerance(dtype, expected, num_in))
    if with_residual:
        # the stored residual: x + res rounded once (to nearest on the GPU; the interpreter truncates)
        ulp = 0.0 if ON_GPU or dtype == torch.float32 else torch.finfo(dtype).eps * float(h.float().abs().max())
        assert new_residual is not x
        torch.testing.assert_close(new_residual.float(), h.float(), atol=ulp, rtol=0)
    else:
        assert new_residual is x


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_rms_norm_gemv_without_bias_and_other_tiles(swiglu, device):
    """No bias, and tiles a sweep would try (more rows a program, narrower K chunks)."""
    x, res, norm_weight, weight, _ = _inputs(70, 700, torch.float32, device, residual=True, bias=False)
    expected, _ = _fp32_reference(x, res, norm_weight, weight, None, swiglu)
    # PREFETCH: the next chunk's weights in flight (K = 700 is 6 chunks of 128, the last one partial)
    for tiles in ({}, {"BLOCK_N": 8, "BLOCK_K": 128, "num_warps": 4}, {"BLOCK_K": 128, "PREFETCH": 1}):
        got, _ = rms_norm_gemv(x, res, norm_weight, EPS, weight, swiglu=swiglu, tiles=tiles)
        torch.testing.assert_close(got, expected, **one_token_tolerance(torch.float32, expected, 700))


def test_rms_norm_gemv_refuses_what_it_does_not_do(device):
    x, g, weight = torch.randn(1, 16, device=device), torch.ones(16, device=device), torch.randn(8, 16, device=device)
    with pytest.raises(ValueError, match="single token"):
        rms_norm_gemv(torch.randn(2, 16, device=device), None, g, EPS, weight)
    with pytest.raises(ValueError, match="residual must match"):
        rms_norm_gemv(x, torch.randn(1, 12, device=device), g, EPS, weight)
    with pytest.raises(ValueError, match="norm_weight"):
        rms_norm_gemv(x, None, torch.ones(12, device=device), EPS, weight)
    with pytest.raises(ValueError, match="needs K"):
        rms_norm_gemv(x, None, g, EPS, torch.randn(8, 12, device=device))
    with pytest.raises(ValueError, match="even number"):
        rms_norm_gemv(x, None, g, EPS, torch.randn(7, 16, device=device), swiglu=True)
    with pytest.raises(ValueError, match="bias"):
        rms_norm_gemv(x, None, g, EPS, weight, torch.randn(9, device=device))
    with pytest.raises(ValueError, match="tiles"):
        rms_norm_gemv(x, None, g, EPS, weight, tiles={"BLOCK_M": 4})


@pytest.mark.parametrize("swiglu", [False, True, "separate"], ids=["plain", "swiglu", "swiglu_separate"])
@pytest.mark.parametrize("num_tokens", [1, 3])
@pytest.mark.parametrize("with_residual", [False, True], ids=["nores", "residual"])
def test_ops_rms_norm_linear_agrees_across_backends(with_residual, num_tokens, swiglu, device, monkeypatch):
    """engine.ops.rms_norm_linear through the fused kernel (thresholds lowered to these small sizes, one
    token only; SwiGLU inside it or, above SWIGLU_GEMV_MAX_FEATURES, as its own kernel after it) and through the
    unfused torch references give the same projection and residual."""
    monkeypatch.setattr(ops, "GEMV_MIN_FEATURES", 32)
    monkeypatch.setattr(ops, "GEMV_MIN_FEATURES_PDL", 32)  # the threshold where kernels launch with PDL
    monkeypatch.setattr(ops, "NORM_GEMV_MIN_FEATURES", 32)
    monkeypatch.setattr(ops, "NORM_GEMV_MIN_FEATURES_PDL", 32)
    monkeypatch.setattr(ops, "SWIGLU_GEMV_MAX_FEATURES", 32 if swiglu == "separate" else 4096)
    swiglu = bool(swiglu)
    x = torch.randn(num_tokens, 96, device=device)
    res = torch.randn(num_tokens, 96, device=device) if with_residual else None
    g = 1 + 0.3 * torch.randn(96, device=device)
    weight, bias = torch.randn(40, 96, device=device) / 10, torch.randn(40, device=device)
    with ops.kernel_backend("triton"):
        assert ops.uses_gemv(x, weight) == (num_tokens == 1)
        fast, fast_res = ops.rms_norm_linear(x, res, g, EPS, weight, bias, swiglu=swiglu)
    with ops.kernel_backend("torch"):
        slow, slow_res = ops.rms_norm_linear(x, res, g, EPS, weight, bias, swiglu=swiglu)
    assert fast.shape == slow.shape == (num_tokens, 20 if swiglu else 40)
    torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast_res, slow_res, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no-pdl"])
def test_small_models_take_the_one_token_kernels_only_where_they_chain_with_pdl(pdl, monkeypatch):
    """The dispatch thresholds (engine/ops.py; measured on an H100 on 2026-11-27): with PDL, the projections of
    the small models (smallest weight dims: Qwen3-0.6B 1024, Qwen2.5-0.5B 896, SmolLM2-135M 576) take the GEMV
    kernels, plain and norm-fused; without PDL (no Hopper, INFERQ_PDL=0) only weights of 4096 / 2048 do."""
    monkeypatch.setattr(ops, "use_pdl", lambda device: pdl)
    one = torch.empty(1, 576)
    smollm2_o_proj, smollm2_gate_up = torch.empty(576, 576), torch.empty(2 * 1536, 576)
    llama_1b_qkv = torch.empty(3072, 2048)
    with ops.kernel_backend("triton"):
        assert ops.uses_gemv(one, smollm2_o_proj) is pdl
        assert ops.uses_gemv(one, smollm2_gate_up, ops.norm_gemv_min_features(one.device)) is pdl
        assert ops.uses_gemv(torch.empty(1, 2048), llama_1b_qkv, ops.norm_gemv_min_features(one.device))
        assert not ops.uses_gemv(torch.empty(1, 256), torch.empty(256, 256))  # below every threshold
        assert not ops.uses_gemv(torch.empty(2, 576), smollm2_o_proj)  # two tokens: cuBLAS
