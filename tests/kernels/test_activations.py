"""SiLU-and-mul and tanh-GELU kernels against their torch references."""

from __future__ import annotations

import pytest
import torch

from kernels.gelu_tanh import gelu_tanh, gelu_tanh_ref
from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

ON_GPU = torch.cuda.is_available()
# exp(-2u) overflows to inf for very negative inputs on purpose (the result is -0); numpy warns under the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
SHAPES = [(1, 2 * 64), (7, 2 * 300), (3, 2 * 2500), (2, 5, 2 * 48)]  # 2500 > one program's 2048 columns
if ON_GPU:
    SHAPES += [(4096, 2 * 8192), (1, 2 * 14336), (333, 2 * 11008)]
DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="fp32"),
    pytest.param(torch.float16, dict(atol=2e-3, rtol=2e-3), id="fp16"),
    pytest.param(torch.bfloat16, dict(atol=1e-2, rtol=1.6e-2), id="bf16"),
]


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_silu_and_mul_matches_reference(shape, dtype, tol, device, poison_allocator):
    x = (torch.randn(shape, device=device) * 4).to(dtype)
    poison_allocator((*shape[:-1], shape[-1] // 2), dtype, device)
    out = silu_and_mul(x)
    torch.testing.assert_close(out, silu_and_mul_ref(x), **tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_silu_and_mul_of_a_strided_view(dtype, tol, device):
    wide = torch.randn(9, 3 * 128, device=device).to(dtype)
    x = wide[:, : 2 * 128]  # rows 384 apart, last dim contiguous
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), **tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_tanh_matches_reference(shape, dtype, tol, device, poison_allocator):
    x = (torch.randn(shape, device=device) * 3).to(dtype)
    poison_allocator(shape, dtype, device)
    out = gelu_tanh(x)
    torch.testing.assert_close(out, gelu_tanh_ref(x), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activations_stay_finite_at_extremes(dtype, device):
    x = torch.tensor([-1e4, -100.0, -20.0, -0.0, 0.0, 1e-6, 20.0, 100.0, 1e4], device=device).to(dtype)
    torch.testing.assert_close(gelu_tanh(x), gelu_tanh_ref(x), atol=1e-5, rtol=1.6e-2)
    pairs = torch.stack([x, torch.ones_like(x)], dim=0).reshape(1, -1)  # gate = x, up = 1
    out = silu_and_mul(pairs)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, silu_and_mul_ref(pairs), atol=1e-5, rtol=1.6e-2)


def test_silu_and_mul_rejects_odd_width(device):
    with pytest.raises(ValueError, match="must be even"):
        silu_and_mul(torch.randn(2, 7, device=device))
