"""NeoX rotary embedding kernel (in place) against its torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.rope import apply_rope, apply_rope_ref

ON_GPU = torch.cuda.is_available()
# (tokens, Hq, Hkv, D)
# the last two take several head chunks (rope_tiles: at most 4096 elements a chunk): q's alone, and q's and k's
SHAPES = [(1, 4, 1, 64), (7, 8, 2, 80), (5, 2, 2, 128), (3, 6, 6, 32), (3, 40, 10, 256), (2, 40, 40, 256)]
if ON_GPU:
    SHAPES += [(4096, 32, 8, 128), (1, 64, 8, 128), (333, 16, 2, 256), (1000, 14, 2, 64)]
DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="fp32"),
    pytest.param(torch.float16, dict(atol=2e-3, rtol=2e-3), id="fp16"),
    pytest.param(torch.bfloat16, dict(atol=1e-2, rtol=1.6e-2), id="bf16"),
]
MAX_POSITIONS = 5000


def cos_sin_cache(head_dim: int, device, base: float = 10000.0) -> torch.Tensor:
    """[P, D]: cos | sin of position * inv_freq, as the engine builds it."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(MAX_POSITIONS, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rope_on_views_of_a_fused_projection(shape, dtype, tol, device):
    num_tokens, num_heads, num_kv_heads, head_dim = shape
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=device).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
    positions = torch.randint(0, MAX_POSITIONS, (num_tokens,), device=device)
    positions[0] = MAX_POSITIONS - 1
    cache = cos_sin_cache(head_dim, device)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_ref(q_ref, k_ref, positions, cache)
    apply_rope(q, k, positions, cache)
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(k, k_ref, **tol)
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], v_before)  # v untouched


def test_rope_at_position_zero_is_identity(device):
    q, k = torch.randn(3, 4, 64, device=device), torch.randn(3, 2, 64, device=device)
    q0, k0 = q.clone(), k.clone()
    apply_rope(q, k, torch.zeros(3, dtype=torch.int32, device=device), cos_sin_cache(64, device))
    torch.testing.assert_close(q, q0, atol=0, rtol=0)
    torch.testing.assert_close(k, k0, atol=0, rtol=0)


def test_rope_reference_matches_float64_rotation(device):
    """The reference rotates pair (i, i + D/2) by position * base^(-2i/D) (NeoX)."""
    q, k = torch.randn(4, 2, 16, device=device), torch.randn(4, 1, 16, device=device)
    positions = torch.tensor([0, 1, 7, 4999], device=device)
    expected = q.double().clone()
    for t, pos in enumerate(positions.tolist()):
        for i in range(8):
            angle = pos * 10000.0 ** (-2 * i / 16)
            x1, x2 = q[t, :, i].double(), q[t, :, i + 8].double()
            expected[t, :, i] = x1 * math.cos(angle) - x2 * math.sin(angle)
            expected[t, :, i + 8] = x2 * math.cos(angle) + x1 * math.sin(angle)
    apply_rope_ref(q, k, positions, cos_sin_cache(16, device))
    torch.testing.assert_close(q.double(), expected, atol=1e-5, rtol=1e-5)


def test_rope_rejects_a_cache_of_the_wrong_width(device):
    q, k = torch.randn(3, 4, 64, device=device), torch.randn(3, 2, 64, device=device)
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        apply_rope(q, k, torch.zeros(3, dtype=torch.int64, device=device), cos_sin_cache(32, device))
