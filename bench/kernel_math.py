"""The floors of the kernel benchmarks: bytes moved and FLOPs done per call, counted
before anything is timed (see /work/shared/BENCHMARKS.md, "Method").

Legend: T = tokens, H = hidden size, I = intermediate size, B = sequences, S = sequence
length, L = context length, Hq/Hkv = query/KV heads, D = head dim. Element sizes in
bytes; every count is exact for the layouts the benchmark builds. Pure arithmetic,
no torch, so it is unit-checked on any machine.
"""

from __future__ import annotations

HEAD_DIM = 128
GQA = 4  # query heads per KV head in the small-kernel shapes (Llama-3 style)


def heads_for_hidden(hidden: int) -> tuple[int, int]:
    """(Hq, Hkv) of a model with this hidden size, D = 128 and GQA 4."""
    num_heads = hidden // HEAD_DIM
    return num_heads, max(1, num_heads // GQA)


def causal_attention_flops(seq_len: int, num_heads: int, head_dim: int) -> float:
    """FLOPs of causal self-attention over one sequence: QK^T and PV, 2 FLOPs per MAC, half the square."""
    return 2 * 2 * seq_len * seq_len * head_dim * num_heads / 2


def prefill_flops(batch: int, seq_len: int, num_heads: int, head_dim: int) -> float:
    return batch * causal_attention_flops(seq_len, num_heads, head_dim)


def decode_kv_bytes(batch: int, context: int, num_kv_heads: int, head_dim: int, elem: int) -> int:
    """K and V read once by a decode step over every sequence's whole context."""
    return 2 * batch * context * num_kv_heads * head_dim * elem


def rms_norm_bytes(tokens: int, hidden: int, elem: int) -> int:
    """Read x [T, H] and weight [H], write out [T, H]."""
    return 2 * tokens * hidden * elem + hidden * elem


def fused_add_rms_norm_bytes(tokens: int, hidden: int, elem: int) -> int:
    """Read x and residual, write out and the new residual (all [T, H]), read weight [H]."""
    return 4 * tokens * hidden * elem + hidden * elem


def silu_and_mul_bytes(tokens: int, inter: int, elem: int) -> int:
    """Read [T, 2I], write [T, I]."""
    return 3 * tokens * inter * elem


def rope_bytes(tokens: int, hidden: int, elem: int, cache_elem: int = 4, pos_elem: int = 8) -> int:
    """Read and write q [T, Hq, D] and k [T, Hkv, D] in place, read one cos|sin row [D] and a position per token."""
    num_heads, num_kv_heads = heads_for_hidden(hidden)
    return 2 * tokens * (num_heads + num_kv_heads) * HEAD_DIM * elem + tokens * (HEAD_DIM * cache_elem + pos_elem)


def store_kv_bytes(tokens: int, hidden: int, elem: int, slot_elem: int = 8) -> int:
    """Read k and v [T, Hkv, D], write them into the pool, read a slot per token."""
    _, num_kv_heads = heads_for_hidden(hidden)
    return 4 * tokens * num_kv_heads * HEAD_DIM * elem + tokens * slot_elem


def rope_store_kv_bytes(tokens: int, hidden: int, elem: int, cache_elem: int = 4, index_elem: int = 8) -> int:
    """Read and write q in place; read k and v, write them into the pool; per token: cos|sin, a position, a slot."""
    num_heads, num_kv_heads = heads_for_hidden(hidden)
    return (2 * tokens * (num_heads + 2 * num_kv_heads) * HEAD_DIM * elem
            + tokens * (HEAD_DIM * cache_elem + 2 * index_elem))  # fmt: skip


SMALL_KERNEL_BYTES = {
    "rms_norm": rms_norm_bytes,
    "fused_add_rms_norm": fused_add_rms_norm_bytes,
    "rope": rope_bytes,
    "silu_and_mul": silu_and_mul_bytes,  # width = I
    "store_kv": store_kv_bytes,
    "rope_store_kv": rope_store_kv_bytes,
}


def rotations(bytes_per_call: int, l2_bytes: int, limit: int = 64) -> int:
    """Input copies to cycle through so that the set is at least twice the L2 (at most `limit`)."""
    if bytes_per_call <= 0:
        return 1
    return max(1, min(limit, -(-2 * l2_bytes // bytes_per_call)))


def check_arithmetic() -> None:
    """Hand-computed values; raises AssertionError on a slip (run by --dry-run and the tests)."""
    assert heads_for_hidden(4096) == (32, 8)
    assert heads_for_hidden(2048) == (16, 4)
    # S = 1k, 32 heads, D = 128: 4 * 1024^2 * 128 * 32 / 2 = 2^2 * 2^20 * 2^7 * 2^5 / 2 = 2^33
    assert causal_attention_flops(1024, 32, 128) == 2**33
    assert prefill_flops(16, 1024, 32, 128) == 16 * 2**33
    # B=1, L=4096, 8 KV heads, D=128, bf16: K and V of 4096 * 8 * 128 * 2 B = 8 MiB each
    assert decode_kv_bytes(1, 4096, 8, 128, 2) == 16 * 2**20
    assert rms_norm_bytes(1, 4096, 2) == 3 * 8192
    assert fused_add_rms_norm_bytes(2, 2048, 2) == 4 * 2 * 2048 * 2 + 2048 * 2
    assert silu_and_mul_bytes(10, 1000, 2) == 60_000
    # hidden 4096: 32 + 8 heads of 128, read + write, bf16 -> 20480 B per token, + fp32 cos|sin 512 B + int64 8 B
    assert rope_bytes(1, 4096, 2) == 2 * 40 * 128 * 2 + 128 * 4 + 8
    assert store_kv_bytes(1, 4096, 2) == 4 * 8 * 128 * 2 + 8
    # q (32 heads) read + written, k and v (8 heads each) read + written into the pool, + cos|sin, position, slot
    assert rope_store_kv_bytes(1, 4096, 2) == 2 * 48 * 128 * 2 + 128 * 4 + 16
    assert rotations(16 * 2**20, 50 * 2**20) == 7
    assert rotations(2**30, 50 * 2**20) == 1
    assert rotations(100, 50 * 2**20) == 64
