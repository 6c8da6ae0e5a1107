"""Sliding-window paged attention: the prefill and decode kernels against their torch references, and the
references against dense masked attention.

A query at position p sees keys p - W + 1 .. p. Every block that lies wholly before the first key tile any
query of its sequence needs is filled with NaN, so a kernel that reads a skipped block (keys or values, even
masked) returns NaN; the references slice those blocks off before reading.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.decode_split_merge import MERGES
from kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref

ON_GPU = torch.cuda.is_available()
WIDEST_KEY_TILE = 128  # the largest BLOCK_N of either kernel: blocks before such a tile are never loaded

DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-4, rtol=1e-4), id="fp32"),
    pytest.param(torch.bfloat16, dict(atol=2e-2, rtol=2e-2), id="bf16"),
]

# (query_lens, context_lens, Hq, Hkv, D, block size, window): a window of 1 (the query itself), windows
# shorter than a query tile, windows cutting key tiles, chunks over long contexts, a window longer than the
# sequence, GQA and head dims 64 / 80 / 256.
PREFILL_CASES = [
    ([9], [0], 4, 1, 64, 16, 1),
    ([40], [0], 4, 2, 64, 16, 5),
    ([17, 3], [150, 0], 8, 2, 64, 16, 21),
    ([6, 1, 30], [200, 300, 2], 4, 1, 80, 16, 48),
    ([33], [260], 4, 4, 64, 8, 100),
    ([12, 5], [3, 0], 2, 1, 64, 16, 4096),
    ([5, 9], [170, 140], 4, 2, 256, 16, 33),
]
if ON_GPU:
    PREFILL_CASES += [
        ([1000, 1, 77, 513], [0, 3000, 3000, 600], 32, 8, 128, 16, 512),
        ([4096], [0], 8, 1, 256, 64, 512),
        ([700, 300], [0, 9000], 16, 2, 256, 64, 1024),
        ([100, 3], [8000, 64], 32, 4, 128, 128, 129),
        ([2048], [30000], 32, 8, 128, 64, 4096),
    ]

# (context_lens, Hq, Hkv, D, block size, window); seq_len = context + 1
DECODE_CASES = [
    ([0, 5, 40], 4, 1, 64, 16, 1),
    ([300, 17, 64], 8, 2, 64, 16, 24),
    ([250, 251, 90], 4, 4, 80, 8, 100),
    ([333], 8, 1, 256, 16, 40),
    ([10, 20], 4, 2, 64, 16, 4096),
]
if ON_GPU:
    DECODE_CASES += [
        ([32767], 8, 1, 256, 64, 1024),
        ([32000, 100, 5000], 32, 8, 128, 64, 4096),
        ([20000] * 16, 4, 1, 256, 64, 512),
    ]


def _case_id(case) -> str:
    return "-".join("x".join(map(str, c)) if isinstance(c, list) else str(c) for c in case)


def poison_blocks_before_window(batch, query_lens: list[int], window: int) -> int:
    """NaN in every block of each sequence that ends before the widest key tile holding its first visible key.
    Returns how many blocks were poisoned (the test must poison some to prove anything)."""
    block_size = batch.k_cache.shape[1]
    poisoned = 0
    for s, (seq_len, q_len) in enumerate(zip(batch.seq_lens_cpu, query_lens)):
        first_key = max(0, seq_len - q_len - window + 1)
        skipped_blocks = first_key // WIDEST_KEY_TILE * WIDEST_KEY_TILE // block_size
        for b in batch.block_tables[s, :skipped_blocks].tolist():
            batch.kv_cache[:, b] = float("nan")
            poisoned += 1
    return poisoned


def dense_window_attention(q, k, v, q_pos, window, scale):
    """One sequence, keys 0..L-1 unpaged: q [Tq, Hq, D], k/v [L, Hq, D] -> [Tq, Hq, D] (fp32)."""
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    k_pos = torch.arange(k.shape[0])[None, :]
    hidden = (k_pos > q_pos[:, None]) | (k_pos <= q_pos[:, None] - window)
    scores.masked_fill_(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v.float())


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=_case_id)
def test_prefill_window_matches_reference_and_skips_blocks(case, dtype, tol, paged_batch):
    query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, window = case
    batch = paged_batch(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype)
    poisoned = poison_blocks_before_window(batch, query_lens, window)
    # nothing to poison only where no sequence's first visible key (context - window + 1) reaches the widest tile
    assert poisoned > 0 or max(context_lens) - window + 1 < WIDEST_KEY_TILE
    scale = 1.0 / math.sqrt(head_dim)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc)
    out = paged_prefill_attention(*args, max(query_lens), scale, window=window)
    ref = paged_prefill_attention_ref(*args, scale, window)
    assert not ref.isnan().any()
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3, 7])
@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_window_matches_reference_and_skips_blocks(case, num_splits, dtype, tol, paged_batch):
    context_lens, num_heads, num_kv_heads, head_dim, block_size, window = case
    query_lens = [1] * len(context_lens)
    batch = paged_batch(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype)
    poison_blocks_before_window(batch, query_lens, window)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 1.0 / math.sqrt(head_dim))
    ref = paged_decode_attention_ref(*args, window)
    assert not ref.isnan().any()
    for merge in MERGES:
        out = paged_decode_attention(*args, num_splits=num_splits, merge=merge, window=window)
        torch.testing.assert_close(out, ref, **tol)


def test_decode_window_with_length_order(paged_batch):
    """The length-ordered grid (one split a program, longest context first) with a window."""
    context_lens = [5, 300, 40, 129]
    batch = paged_batch([1] * 4, context_lens, 4, 2, 64, 16, torch.float32)
    poison_blocks_before_window(batch, [1] * 4, 30)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.125)
    order = torch.argsort(batch.seq_lens, descending=True)
    out = paged_decode_attention(*args, num_splits=1, order=order, window=30)
    torch.testing.assert_close(out, paged_decode_attention_ref(*args, 30), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 7, 16, 50, 1000])
def test_reference_window_is_dense_masked_attention(window, paged_batch):
    """The reference (which gathers only the window's blocks) against plain attention over unpaged keys."""
    query_lens, context_lens = [20, 1], [60, 44]
    batch = paged_batch(query_lens, context_lens, 4, 2, 64, 16, torch.float32)
    ref = paged_prefill_attention_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                      batch.query_start_loc, 0.125, window)  # fmt: skip
    start = 0
    for s, (q_len, seq_len) in enumerate(zip(query_lens, batch.seq_lens_cpu)):
        pos = torch.arange(seq_len)
        slots = batch.block_tables[s, pos // 16].long().cpu() * 16 + pos % 16
        k = batch.k_cache.reshape(-1, 2, 64)[slots.to(batch.k_cache.device)].repeat_interleave(2, dim=1).cpu()
        v = batch.v_cache.reshape(-1, 2, 64)[slots.to(batch.v_cache.device)].repeat_interleave(2, dim=1).cpu()
        q_pos = torch.arange(seq_len - q_len, seq_len)
        expected = dense_window_attention(batch.q[start : start + q_len].cpu(), k, v, q_pos, window, 0.125)
        torch.testing.assert_close(ref[start : start + q_len].cpu(), expected, atol=1e-5, rtol=1e-5)
        start += q_len


def test_window_must_be_positive(paged_batch):
    batch = paged_batch([1], [4], 4, 1, 64, 16, torch.float32)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.125)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="window"):
            paged_decode_attention(*args, window=bad)
        with pytest.raises(ValueError, match="window"):
            paged_prefill_attention(*args[:5], batch.query_start_loc, 1, 0.125, window=bad)
