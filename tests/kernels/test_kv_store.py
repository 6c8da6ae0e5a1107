"""KV store kernel against its torch reference: exact copies into shuffled slots, -1 skipped."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_store import store_kv, store_kv_ref

ON_GPU = torch.cuda.is_available()
# (tokens, Hkv, D, blocks, block size)
SHAPES = [(1, 1, 64, 4, 16), (7, 2, 80, 3, 4), (33, 8, 128, 5, 16), (5, 4, 256, 2, 8)]
if ON_GPU:
    SHAPES += [(4096, 8, 128, 400, 16), (32768, 8, 128, 2100, 16), (100, 2, 64, 20, 32)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_store_kv_writes_exactly_the_mapped_slots(shape, dtype, device):
    num_tokens, num_kv_heads, head_dim, num_blocks, block_size = shape
    qkv = torch.randn(num_tokens, (4 + 2) * num_kv_heads * head_dim, device=device).to(dtype)
    k = qkv[:, 4 * num_kv_heads * head_dim : 5 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v = qkv[:, 5 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[::3] = -1  # padding tokens: nothing stored
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    expected = kv_cache.clone()
    store_kv_ref(k, v, expected[0], expected[1], slots)
    store_kv(k, v, kv_cache[0], kv_cache[1], slots)
    torch.testing.assert_close(kv_cache, expected, atol=0, rtol=0, equal_nan=True)
    assert int(torch.isnan(kv_cache).any(dim=(0, 3, 4)).sum()) == num_blocks * block_size - int((slots >= 0).sum())


def test_store_kv_casts_into_the_pool_dtype(device):
    k, v = torch.randn(5, 2, 64, device=device), torch.randn(5, 2, 64, device=device)
    kv_cache = torch.zeros(2, 2, 4, 2, 64, dtype=torch.bfloat16, device=device)
    expected = kv_cache.clone()
    slots = torch.tensor([6, 0, -1, 3, 7], device=device, dtype=torch.int32)
    store_kv_ref(k, v, expected[0], expected[1], slots)
    store_kv(k, v, kv_cache[0], kv_cache[1], slots)
    # the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest: one bf16 ulp
    torch.testing.assert_close(kv_cache, expected, atol=0, rtol=1e-2)


def test_store_kv_rejects_mismatched_heads(device):
    k = torch.randn(3, 2, 64, device=device)
    kv_cache = torch.zeros(2, 2, 4, 4, 64, device=device)
    with pytest.raises(ValueError, match="must match k's"):
        store_kv(k, k, kv_cache[0], kv_cache[1], torch.zeros(3, dtype=torch.int64, device=device))
