"""RoPE fused with the KV store against apply_rope_ref + store_kv_ref: q rotated in place,
rotated keys and plain values in their slots (-1 skipped), k and v left as they were."""

from __future__ import annotations

import pytest
import torch

from kernels.rope_store_kv import rope_store_kv, rope_store_kv_ref
from tests.kernels.test_rope import DTYPES, MAX_POSITIONS, cos_sin_cache

ON_GPU = torch.cuda.is_available()
# (tokens, Hq, Hkv, D, blocks, block size): one token, odd counts that cross token tiles,
# GQA 1 / 4 / 8, head dims that are not powers of two
# the last two take several head chunks (rope.py's rope_tiles): q's alone, and q's and k's
SHAPES = [(1, 4, 1, 64, 2, 16), (7, 8, 2, 80, 3, 4), (5, 2, 2, 128, 2, 8), (9, 8, 1, 32, 4, 4), (3, 40, 10, 256, 2, 4),
          (2, 40, 40, 256, 2, 4)]  # fmt: skip
if ON_GPU:
    SHAPES += [(4096, 32, 8, 128, 600, 16), (1, 64, 8, 128, 4, 16), (333, 16, 2, 256, 30, 16),
               (1000, 14, 2, 64, 70, 16), (32768, 16, 4, 128, 4200, 16)]  # fmt: skip


def fused_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype, device):
    """q, k, v as the engine has them: views of one [T, (Hq + 2 Hkv) D] projection output."""
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=device).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    return qkv, q, k, v


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rope_store_kv_matches_rope_then_store(shape, dtype, tol, device):
    num_tokens, num_heads, num_kv_heads, head_dim, num_blocks, block_size = shape
    qkv, q, k, v = fused_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype, device)
    kv_before = qkv[:, num_heads * head_dim :].clone()
    positions = torch.randint(0, MAX_POSITIONS, (num_tokens,), device=device)
    positions[-1] = MAX_POSITIONS - 1
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[1::3] = -1  # padding tokens: q still rotated, nothing stored
    cache = cos_sin_cache(head_dim, device)
    pool = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    pool_ref, q_ref = pool.clone(), q.clone()
    rope_store_kv_ref(q_ref, k, v, positions, cache, pool_ref[0], pool_ref[1], slots)
    rope_store_kv(q, k, v, positions, cache, pool[0], pool[1], slots)
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(pool[0], pool_ref[0], equal_nan=True, **tol)
    torch.testing.assert_close(pool[1], pool_ref[1], atol=0, rtol=0, equal_nan=True)  # values: exact copies
    assert torch.equal(qkv[:, num_heads * head_dim :], kv_before)  # k and v untouched
    stored = int(torch.isnan(pool[0]).any(dim=(2, 3)).logical_not().sum())
    assert stored == int((slots >= 0).sum())


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rope_store_kv_with_qk_norm_matches_norm_then_rope_then_store(shape, dtype, tol, device):
    """Qwen3's per-head RMSNorm of q and k before the rotation, fused: against rms_norm_ref per
    head, then the rotation and the store. k and v in the projection output stay as they were."""
    num_tokens, num_heads, num_kv_heads, head_dim, num_blocks, block_size = shape
    qkv, q, k, v = fused_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype, device)
    qkv.mul_(3.0)  # norms far from 1, so that a missing normalization shows
    kv_before = qkv[:, num_heads * head_dim :].clone()
    positions = torch.randint(0, MAX_POSITIONS, (num_tokens,), device=device)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[::4] = -1
    cache = cos_sin_cache(head_dim, device)
    qk_norm = (torch.rand(head_dim, device=device).to(dtype) + 0.5, torch.rand(head_dim, device=device).to(dtype), 1e-6)
    pool = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    pool_ref, q_ref = pool.clone(), q.clone()
    rope_store_kv_ref(q_ref, k, v, positions, cache, pool_ref[0], pool_ref[1], slots, qk_norm=qk_norm)
    rope_store_kv(q, k, v, positions, cache, pool[0], pool[1], slots, qk_norm=qk_norm)
    # NOTE: the kernel sums the squares in another order than rms_norm_ref, so now and then a
    # normalized value rounds the other way before the rotation: one rounding of the largest
    # value apart, at a few elements; the rest stays within the dtype's usual tolerance.
    for got, want in ((q, q_ref), (pool[0], pool_ref[0])):
        atol = max(tol["atol"], torch.finfo(dtype).eps * float(want.nan_to_num().abs().max()))
        torch.testing.assert_close(got, want, atol=atol, rtol=tol["rtol"], equal_nan=True)
        off = ((got - want).abs() > tol["atol"] + tol["rtol"] * want.abs()).sum()
        assert int(off) <= max(1, want.numel() // 200), f"{int(off)} of {want.numel()} values off"
    torch.testing.assert_close(pool[1], pool_ref[1], atol=0, rtol=0, equal_nan=True)
    assert torch.equal(qkv[:, num_heads * head_dim :], kv_before)


def test_rope_store_kv_with_qk_norm_at_position_zero_stores_normalized_heads(device):
    _, q, k, v = fused_views(3, 4, 2, 64, torch.float32, device)
    q.mul_(5.0)
    k.mul_(0.1)
    pool = torch.zeros(2, 2, 4, 2, 64, device=device)
    slots = torch.tensor([5, 0, 7], device=device)
    ones = torch.ones(64, device=device)
    q_expected = q / q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    k_expected = k / k.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    rope_store_kv(q, k, v, torch.zeros(3, dtype=torch.int64, device=device), cos_sin_cache(64, device),
                  pool[0], pool[1], slots, qk_norm=(ones, ones, 1e-6))  # fmt: skip
    flat = pool.view(2, 8, 2, 64)
    torch.testing.assert_close(q, q_expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flat[0, slots], k_expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flat[1, slots], v, atol=0, rtol=0)


def test_rope_store_kv_rejects_a_qk_norm_weight_of_another_size(device):
    _, q, k, v = fused_views(3, 4, 2, 64, torch.float32, device)
    pool = torch.zeros(2, 2, 4, 2, 64, device=device)
    bad = (torch.ones(32, device=device), torch.ones(64, device=device), 1e-6)
    with pytest.raises(ValueError, match="q norm weight must be a contiguous"):
        rope_store_kv(q, k, v, torch.zeros(3, dtype=torch.int64, device=device), cos_sin_cache(64, device),
                      pool[0], pool[1], torch.zeros(3, dtype=torch.int64, device=device), qk_norm=bad)  # fmt: skip


def test_rope_store_kv_at_position_zero_stores_k_unrotated(device):
    _, q, k, v = fused_views(3, 4, 2, 64, torch.float32, device)
    q0 = q.clone()
    pool = torch.zeros(2, 2, 4, 2, 64, device=device)
    slots = torch.tensor([5, 0, 7], device=device)
    rope_store_kv(q, k, v, torch.zeros(3, dtype=torch.int64, device=device), cos_sin_cache(64, device),
                  pool[0], pool[1], slots)  # fmt: skip
    flat = pool.view(2, 8, 2, 64)
    torch.testing.assert_close(q, q0, atol=0, rtol=0)
    torch.testing.assert_close(flat[0, slots], k, atol=0, rtol=0)
    torch.testing.assert_close(flat[1, slots], v, atol=0, rtol=0)


def test_rope_store_kv_rejects_a_pool_of_other_heads(device):
    _, q, k, v = fused_views(3, 4, 2, 64, torch.float32, device)
    pool = torch.zeros(2, 2, 4, 4, 64, device=device)
    with pytest.raises(ValueError, match="must match k's"):
        rope_store_kv(q, k, v, torch.zeros(3, dtype=torch.int64, device=device), cos_sin_cache(64, device),
                      pool[0], pool[1], torch.zeros(3, dtype=torch.int64, device=device))  # fmt: skip
