"""RMSNorm, fused add + RMSNorm and LayerNorm kernels against their torch references."""

from __future__ import annotations

import pytest
import torch

from kernels.layer_norm import layer_norm, layer_norm_ref
from kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref

ON_GPU = torch.cuda.is_available()
# (rows..., hidden): a single token, odd row counts and widths that are not a power of two
SHAPES = [(1, 64), (7, 300), (33, 1024), (2, 3, 5, 48), (96,)]
if ON_GPU:
    SHAPES += [(4096, 4096), (3, 8192), (1000, 5120), (17, 2, 11, 2048)]
DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="fp32"),
    pytest.param(torch.float16, dict(atol=2e-3, rtol=2e-3), id="fp16"),
    pytest.param(torch.bfloat16, dict(atol=1e-2, rtol=1.6e-2), id="bf16"),
]


def _unit(shape, dtype, device):
    return torch.randn(shape, device=device).to(dtype)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_matches_reference(shape, dtype, tol, device, poison_allocator):
    x = _unit(shape, dtype, device) * 3
    weight = _unit(shape[-1], dtype, device)
    poison_allocator(shape, dtype, device)
    out = rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(x, weight, 1e-6), **tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_rms_norm_per_head_view_of_fused_projection(dtype, tol, device, poison_allocator):
    """Qwen3's q norm: q [T, Hq, D] is a strided view into the qkv projection's output."""
    num_tokens, num_heads, num_kv_heads, head_dim = (300, 32, 8, 128) if ON_GPU else (5, 4, 2, 64)
    qkv = _unit((num_tokens, (num_heads + 2 * num_kv_heads) * head_dim), dtype, device)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    assert not q.is_contiguous()
    weight = _unit(head_dim, dtype, device)
    before = qkv.clone()
    poison_allocator(q.shape, dtype, device)
    out = rms_norm(q, weight, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(q, weight, 1e-6), **tol)
    assert torch.equal(qkv, before)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_add_rms_norm_matches_reference(shape, dtype, tol, device, poison_allocator):
    x, residual = _unit(shape, dtype, device), _unit(shape, dtype, device) * 4
    weight = _unit(shape[-1], dtype, device)
    x_before, residual_before = x.clone(), residual.clone()
    poison_allocator(shape, dtype, device)
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    torch.testing.assert_close(new_residual, ref_residual, **tol)
    torch.testing.assert_close(out, ref_out, **tol)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm_matches_reference(shape, dtype, tol, device, poison_allocator):
    x = _unit(shape, dtype, device) * 2 + 5  # a large mean: the variance must not cancel
    weight, bias = _unit(shape[-1], dtype, device), _unit(shape[-1], dtype, device)
    poison_allocator(shape, dtype, device)
    out = layer_norm(x, weight, bias, 1e-5)
    torch.testing.assert_close(out, layer_norm_ref(x, weight, bias, 1e-5), **tol)


def test_norms_reject_what_they_do_not_support(device):
    x = torch.randn(4, 64, device=device)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, torch.ones(32, device=device), 1e-6)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        rms_norm(x.to(torch.int32), torch.ones(64, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual must match x"):
        fused_add_rms_norm(x, torch.randn(4, 32, device=device), torch.ones(64, device=device), 1e-6)
    with pytest.raises(ValueError, match="weight and bias must have shape"):
        layer_norm(x, torch.ones(64, device=device), torch.ones(63, device=device), 1e-5)


def test_empty_input_gives_empty_output(device):
    x = torch.randn(0, 64, device=device)
    assert rms_norm(x, torch.ones(64, device=device), 1e-6).shape == (0, 64)
