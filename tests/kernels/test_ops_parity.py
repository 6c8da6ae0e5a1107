"""engine.ops and engine.attention_ops give the same results through the Triton kernels as through the torch
references."""

from __future__ import annotations

import pytest
import torch

from engine import attention_ops, ops
from engine.attention_metadata import AttentionMetadata
from kernels.rope import apply_rope_ref

# bf16 tiles take the interpreter's truncating fp32 -> bf16 cast; fp32 keeps the check tight
DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-4, rtol=1e-4), id="fp32"),
    pytest.param(torch.bfloat16, dict(atol=2e-2, rtol=2e-2), id="bf16"),
]


def both_backends(fn):
    """(result with the Triton kernels, result with the torch references)."""
    with ops.kernel_backend("triton"):
        fast = fn()
    with ops.kernel_backend("torch"):
        slow = fn()
    return fast, slow


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_elementwise_and_norm_ops_agree(dtype, tol, device):
    x = torch.randn(5, 96, device=device).to(dtype)
    residual = torch.randn(5, 96, device=device).to(dtype)
    weight, bias = torch.randn(96, device=device).to(dtype), torch.randn(96, device=device).to(dtype)
    calls = {
        "rms_norm": lambda: ops.rms_norm(x, weight, 1e-6),
        "fused_add_rms_norm": lambda: ops.fused_add_rms_norm(x, residual, weight, 1e-6),
        "layer_norm": lambda: ops.layer_norm(x, weight, bias, 1e-5),
        "silu_and_mul": lambda: ops.silu_and_mul(x),
        "gelu_tanh": lambda: ops.gelu_tanh(x),
    }
    for name, call in calls.items():
        fast, slow = both_backends(call)
        torch.testing.assert_close(fast, slow, **tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_rope_store_kv_and_store_kv_ops_agree(dtype, tol, device):
    q, k = torch.randn(6, 4, 32, device=device).to(dtype), torch.randn(6, 2, 32, device=device).to(dtype)
    v = torch.randn(6, 2, 32, device=device).to(dtype)
    positions = torch.tensor([0, 5, 9, 2, 31, 17], device=device)
    angles = torch.arange(32, device=device)[:, None] * torch.rand(16, device=device)[None, :]
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    slots = torch.tensor([11, -1, 0, 5, 6, -1], device=device)

    def pool():
        return torch.full((2, 3, 4, 2, 32), float("nan"), dtype=dtype, device=device)

    pools, rotated = [pool(), pool()], [q.clone(), q.clone()]
    for backend, q_i, pool_i in zip(("triton", "torch"), rotated, pools):
        with ops.kernel_backend(backend):
            attention_ops.rope_store_kv(q_i, k, v, positions, cache, pool_i, slots)
    torch.testing.assert_close(rotated[0], rotated[1], **tol)
    torch.testing.assert_close(pools[0], pools[1], equal_nan=True, **tol)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_ref(q_ref, k_ref, positions, cache)
    torch.testing.assert_close(rotated[1], q_ref, atol=0, rtol=0)  # torch: exactly the RoPE reference's rotation

    plain = [pool(), pool()]
    for backend, pool_i in zip(("triton", "torch"), plain):
        with ops.kernel_backend(backend):
            attention_ops.store_kv(k, v, pool_i, slots)
    torch.testing.assert_close(plain[0], plain[1], atol=0, rtol=0, equal_nan=True)


def _metadata(batch) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64, device=batch.q.device),
        block_tables=batch.block_tables,
        seq_lens=batch.seq_lens,
        query_start_loc=batch.query_start_loc,
        max_query_len=max(batch.query_lens_cpu),
        max_seq_len=max(batch.seq_lens_cpu),
        seq_lens_cpu=batch.seq_lens_cpu,
        query_lens_cpu=batch.query_lens_cpu,
    )


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("query_lens", [[3, 1, 7], [1, 1, 1]], ids=["prefill", "decode"])
def test_paged_attention_op_agrees(query_lens, dtype, tol, paged_batch):
    batch = paged_batch(query_lens, [0, 20, 5], 8, 2, 64, 16, dtype)
    meta = _metadata(batch)
    assert meta.is_decode_only == (query_lens == [1, 1, 1])
    fast, slow = both_backends(lambda: attention_ops.paged_attention(batch.q, batch.kv_cache, meta, 0.125))
    torch.testing.assert_close(fast, slow, **tol)
