"""GELU-tanh-and-mul (Gemma's GeGLU) against its torch reference, and the reference against transformers'
two-step form (gelu_pytorch_tanh of the gate, times up)."""

from __future__ import annotations

import pytest
import torch

from kernels.gelu_tanh_and_mul import gelu_tanh_and_mul, gelu_tanh_and_mul_ref

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
SHAPES = [(1, 2 * 64), (7, 2 * 300), (3, 2 * 2500), (2, 5, 2 * 48)]
if ON_GPU:
    SHAPES += [(4096, 2 * 6912), (1, 2 * 10240), (333, 2 * 2048)]
DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="fp32"),
    pytest.param(torch.float16, dict(atol=2e-3, rtol=2e-3), id="fp16"),
    pytest.param(torch.bfloat16, dict(atol=1e-2, rtol=1.6e-2), id="bf16"),
]


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_tanh_and_mul_matches_reference(shape, dtype, tol, device, poison_allocator):
    x = (torch.randn(shape, device=device) * 4).to(dtype)
    poison_allocator((*shape[:-1], shape[-1] // 2), dtype, device)
    torch.testing.assert_close(gelu_tanh_and_mul(x), gelu_tanh_and_mul_ref(x), **tol)


def test_gelu_tanh_and_mul_of_a_strided_view_and_extremes(device):
    wide = torch.randn(9, 3 * 128, device=device)
    x = wide[:, : 2 * 128]  # rows 384 apart, last dim contiguous
    torch.testing.assert_close(gelu_tanh_and_mul(x), gelu_tanh_and_mul_ref(x), atol=1e-5, rtol=1e-5)
    gate = torch.tensor([-1e4, -100.0, -20.0, -0.0, 0.0, 1e-6, 20.0, 100.0, 1e4], device=device)
    pairs = torch.cat([gate, torch.ones_like(gate)])[None, :]  # up = 1
    out = gelu_tanh_and_mul(pairs)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, gelu_tanh_and_mul_ref(pairs), atol=1e-5, rtol=1e-5)


def test_reference_is_transformers_gelu_pytorch_tanh():
    from transformers.activations import ACT2FN

    x = torch.randn(5, 2 * 33) * 3
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(gelu_tanh_and_mul_ref(x), ACT2FN["gelu_pytorch_tanh"](gate) * up)


def test_gelu_tanh_and_mul_rejects_odd_width(device):
    with pytest.raises(ValueError, match="must be even"):
        gelu_tanh_and_mul(torch.randn(2, 7, device=device))
