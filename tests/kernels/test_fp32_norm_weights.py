"""Norm kernels with fp32 weights over 16-bit activations: how Gemma's norms run (engine/models/gemma3.py stores
1 + w in fp32, so that the kernels' fp32 multiply and one rounding compute (x * (1 + w)).to(dtype)). RMSNorm, the
one-token norm + projection, and the q / k norms of the RoPE + KV store kernel, each against its reference."""

from __future__ import annotations

import pytest
import torch

from kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref
from kernels.rms_norm_gemv import rms_norm_gemv, rms_norm_gemv_ref
from kernels.rope_store_kv import rope_store_kv, rope_store_kv_ref
from tests.kernels.one_token_tolerance import one_token_tolerance
from tests.kernels.test_rope import cos_sin_cache
from tests.kernels.test_rope_store_kv import fused_views

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


def gemma_weight(n: int, device) -> torch.Tensor:
    """1 + w in fp32, w small (what bf16 could not hold exactly)."""
    return 1.0 + 0.01 * torch.randn(n, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_kernels_take_fp32_weights(dtype, device):
    x = torch.randn(5, 640, device=device).to(dtype)
    residual = torch.randn(5, 640, device=device).to(dtype)
    weight = gemma_weight(640, device)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), atol=2e-2, rtol=1e-2)
    got, got_res = fused_add_rms_norm(x, residual, weight, 1e-6)
    want, want_res = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(got_res, want_res, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_token_norm_projection_takes_fp32_norm_weights(dtype, device):
    num_out, num_in = 130, 640
    x = torch.randn(1, num_in, device=device).to(dtype)
    residual = (3 * torch.randn(1, num_in, device=device)).to(dtype)
    norm_weight = gemma_weight(num_in, device)
    weight = (torch.randn(num_out, num_in, device=device) / num_in**0.5).to(dtype)
    h = (x.float() + residual.float()).to(dtype)
    expected, _ = rms_norm_gemv_ref(h.float(), None, norm_weight, 1e-6, weight.float())
    got, _ = rms_norm_gemv(x, residual, norm_weight, 1e-6, weight)
    torch.testing.assert_close(got.float(), expected, **one_token_tolerance(dtype, expected, num_in))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_kv_takes_fp32_qk_norm_weights(dtype, device):
    num_tokens, num_heads, num_kv_heads, head_dim, num_blocks, block_size = 5, 4, 1, 256, 2, 4
    _, q, k, v = fused_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype, device)
    positions = torch.tensor([0, 3, 9, 17, 30], device=device)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    qk_norm = (gemma_weight(head_dim, device), gemma_weight(head_dim, device), 1e-6)
    pool = torch.zeros((2, num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, device=device)
    pool_ref, q_ref = pool.clone(), q.clone()
    cache = cos_sin_cache(head_dim, device)
    rope_store_kv_ref(q_ref, k, v, positions, cache, pool_ref[0], pool_ref[1], slots, qk_norm=qk_norm)
    rope_store_kv(q, k, v, positions, cache, pool[0], pool[1], slots, qk_norm=qk_norm)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(q, q_ref, atol=4 * eps, rtol=4 * eps)
    torch.testing.assert_close(pool, pool_ref, atol=4 * eps, rtol=4 * eps)
