"""Paged prefill and decode attention kernels against their torch references.

K/V sit in a pool with shuffled block ids and NaN in every slot no sequence owns
(see PagedBatch in conftest.py), so reading past a sequence or through a wrong
block id fails the comparison.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import decode_attention
from kernels._launch import interpreting, ticket_counters
from kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.decode_grid import choose_num_splits, length_order
from kernels.decode_split_merge import MERGES
from kernels.paged_kv import tma_fits
from kernels.prefill_attention import (
    TMA_MIN_QUERY_TOKENS,
    _tile_config,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)

ON_GPU = torch.cuda.is_available()


def _case_id(case) -> str:
    """Short test id: lengths summarized when long, then heads, head dim and block size."""
    parts = []
    for item in case:
        if isinstance(item, list):
            parts.append("x".join(map(str, item)) if len(item) <= 6 else f"{len(item)}seqs-max{max(item)}")
        else:
            parts.append(str(item))
    return "-".join(parts)


DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-4, rtol=1e-4), id="fp32"),
    pytest.param(torch.float16, dict(atol=2e-2, rtol=2e-2), id="fp16"),
    pytest.param(torch.bfloat16, dict(atol=2e-2, rtol=2e-2), id="bf16"),
]

# (query_lens, context_lens, Hq, Hkv, D, block size): single tokens, lengths off the
# tile sizes, empty and long prefixes, a sequence with no new tokens, GQA 1/4/7/8,
# head dims 64/80/96/128/256, block sizes below and above the key tile.
PREFILL_CASES = [
    ([1], [0], 4, 1, 64, 16),
    ([5, 1, 17], [0, 0, 0], 8, 1, 64, 16),
    ([13], [70], 4, 4, 128, 16),
    ([3, 0, 33, 1], [30, 5, 7, 0], 8, 2, 80, 16),
    ([20, 7], [0, 9], 2, 2, 96, 8),
    ([9], [20], 8, 1, 256, 16),
    ([11, 4], [5, 0], 14, 2, 64, 32),
    ([2, 6, 1, 3, 9, 1], [0, 3, 40, 0, 17, 2], 4, 1, 64, 16),
    ([37, 5], [90, 0], 8, 2, 64, 64),
]
if ON_GPU:
    PREFILL_CASES += [
        ([1000, 1, 77, 513], [0, 100, 3000, 0], 32, 8, 128, 16),
        ([4096], [0], 32, 8, 128, 16),
        ([100], [8000], 32, 4, 128, 16),
        ([700, 300], [0, 1234], 16, 2, 256, 16),
        ([555, 129], [64, 0], 8, 8, 80, 16),
        ([300, 45], [17, 1000], 32, 32, 96, 32),
        ([257] * 3, [0, 1, 2], 32, 4, 64, 16),
        # blocks of 64 and 128 tokens: the TMA path (kernels/prefill_attention.py's _tile_config)
        ([1000, 1, 77, 513], [0, 100, 3000, 0], 32, 8, 128, 64),
        ([4096], [0], 32, 8, 128, 64),
        ([100, 3], [8000, 64], 32, 4, 128, 128),
        ([600, 3], [8000, 64], 32, 4, 128, 128),
        ([257] * 3, [0, 1, 2], 32, 4, 64, 64),
        ([520] * 3, [0, 1, 64], 32, 4, 64, 64),
        ([300, 45], [17, 1000], 16, 2, 256, 64),
        ([int(n) for n in torch.randint(1, 300, (64,), generator=torch.Generator().manual_seed(0))],
         [int(n) for n in torch.randint(0, 600, (64,), generator=torch.Generator().manual_seed(1))], 28, 4, 128, 16),
    ]  # fmt: skip


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=_case_id)
def test_prefill_attention_matches_reference(case, dtype, tol, paged_batch, poison_allocator):
    query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size = case
    batch = paged_batch(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype)
    scale = 1.0 / math.sqrt(head_dim)
    poison_allocator(batch.q.shape, dtype, batch.q.device)
    out = paged_prefill_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                  batch.query_start_loc, max(query_lens), scale)  # fmt: skip
    ref = paged_prefill_attention_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                      batch.query_start_loc, scale)  # fmt: skip
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("head_dim,block_size", [(64, 16), (64, 64), (80, 16), (128, 8)])
def test_prefill_attention_takes_tma_where_the_pool_allows(head_dim, block_size, dtype, paged_batch):
    """The TMA path is taken (so the reference tests above run it) exactly where its boxes fit and,
    on the GPU, the prompt is long enough to pay for the descriptors' host cost."""
    batch = paged_batch([3], [40], 4, 1, head_dim, block_size, dtype)
    fits = tma_fits(batch.q, batch.k_cache, batch.v_cache)
    config = _tile_config(head_dim, dtype, 4, TMA_MIN_QUERY_TOKENS, block_size, fits, None)
    short = _tile_config(head_dim, dtype, 4, TMA_MIN_QUERY_TOKENS - 1, block_size, fits, None)
    pow2_head = head_dim in (64, 128)
    if ON_GPU:
        expected = pow2_head and dtype != torch.float32 and block_size % 64 == 0
    else:  # the interpreter: 16-key tiles; its bf16 boxes are misread (tma_fits)
        expected = pow2_head and dtype != torch.bfloat16 and block_size % 16 == 0
    assert config["USE_TMA"] is expected
    assert short["USE_TMA"] is (expected and not ON_GPU)  # the interpreter ignores the threshold
    k = batch.k_cache
    spaced = k.as_strided((k.shape[0] - 1, *k.shape[1:]), (k.stride(0) + 8, *k.stride()[1:]))
    assert not tma_fits(batch.q, spaced, spaced)  # blocks not back to back: no [N * B, Hkv * D] view


def test_prefill_attention_reads_q_through_strides(paged_batch):
    """q cut out of a fused qkv projection: rows (Hq + 2 Hkv) * D apart."""
    batch = paged_batch([6, 3], [4, 0], 4, 2, 64, 16, torch.float32)
    qkv = torch.randn(9, (4 + 4) * 64, device=batch.q.device)
    q = qkv[:, : 4 * 64].view(9, 4, 64)
    args = (batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc)
    out = paged_prefill_attention(q, *args, 6, 0.125)
    torch.testing.assert_close(out, paged_prefill_attention_ref(q, *args, 0.125), atol=1e-4, rtol=1e-4)


# (context_lens, Hq, Hkv, D, block size): seq_len = context + 1
DECODE_CASES = [
    ([0], 4, 1, 64, 16),
    ([0, 9, 20, 47], 8, 1, 64, 16),
    ([140], 8, 2, 80, 16),
    ([3, 0, 33], 2, 2, 96, 8),
    ([5, 60], 2, 2, 256, 16),
    ([31, 16, 15, 64, 1], 14, 2, 128, 32),
]
if ON_GPU:
    DECODE_CASES += [
        ([4095], 32, 8, 128, 16),
        ([65535], 32, 8, 128, 16),
        ([4095] * 16, 32, 8, 128, 16),
        ([int(n) for n in torch.randint(0, 2048, (64,), generator=torch.Generator().manual_seed(2))], 32, 8, 128, 16),
        ([1023] * 256, 32, 8, 128, 16),
        ([999, 5000, 17], 16, 16, 64, 16),
        ([3000, 1], 32, 4, 80, 16),
        ([2500, 77], 8, 1, 96, 32),
        ([1500, 300], 16, 2, 256, 16),
    ]
# (dtype, tolerance, num_splits): None = the launcher's choice (3 on the interpreter)
FP32, FP16, BF16 = (p.values for p in DTYPES)
DECODE_RUNS = [
    pytest.param(*FP32, None, id="fp32-auto_splits"),
    pytest.param(*FP32, 1, id="fp32-1_split"),
    pytest.param(*FP32, 7, id="fp32-7_splits"),
    pytest.param(*FP16, 1, id="fp16-1_split"),
    pytest.param(*BF16, None, id="bf16-auto_splits"),
]


@pytest.mark.parametrize("dtype,tol,num_splits", DECODE_RUNS)
@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_attention_matches_reference(case, dtype, tol, num_splits, paged_batch, poison_allocator):
    context_lens, num_heads, num_kv_heads, head_dim, block_size = case
    batch = paged_batch([1] * len(context_lens), context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype)
    scale = 1.0 / math.sqrt(head_dim)
    poison_allocator(batch.q.shape, dtype, batch.q.device)
    out = paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale,
                                 num_splits=num_splits)  # fmt: skip
    ref = paged_decode_attention_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale)
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("pipeline_min_tiles", [0, 1_000_000], ids=["pipelined", "tile_by_tile"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_attention_each_key_loop_matches_reference(pipeline_min_tiles, num_splits, paged_batch, monkeypatch):
    """A split walks its tiles in the software-pipelined loop from PIPELINE_MIN_TILES tiles on and one by one
    below: each loop alone, over contexts of many tiles (and a partial last tile) and of one."""
    monkeypatch.setattr(decode_attention, "PIPELINE_MIN_TILES", pipeline_min_tiles)
    batch = paged_batch([1] * 4, [700, 1, 63, 257], 8, 2, 64, 16, torch.float32)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.125)
    out = paged_decode_attention(*args, num_splits=num_splits)
    torch.testing.assert_close(out, paged_decode_attention_ref(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_attention_each_merge_matches_reference(case, merge, paged_batch):
    """Both merges at every case, whichever choose_merge would pick for its head dim: the last split
    of each group, or _merge_splits_kernel after the decode kernel."""
    context_lens, num_heads, num_kv_heads, head_dim, block_size = case
    batch = paged_batch([1] * len(context_lens), context_lens, num_heads, num_kv_heads, head_dim, block_size,
                        torch.float32)  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 1.0 / math.sqrt(head_dim))
    out = paged_decode_attention(*args, num_splits=7, merge=merge)
    torch.testing.assert_close(out, paged_decode_attention_ref(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_splits,merge", [(1, None), (5, "last_split"), (5, "kernel")],
                         ids=["1_split", "5_splits-last_split", "5_splits-kernel"])  # fmt: skip
def test_decode_rows_without_keys_get_zeros_and_leave_the_others_exact(num_splits, merge, paged_batch,
                                                                       poison_allocator):  # fmt: skip
    """A CUDA graph's padding rows have seq_len 0: no split of theirs holds a key, yet their output is
    written (0, never the allocator's garbage) and their counters return to zero; the real rows, whose
    short contexts leave most splits empty, match the reference."""
    batch = paged_batch([1, 1, 1], [70, 5, 33], 8, 2, 64, 16, torch.float32)
    real = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.125)
    ref = paged_decode_attention_ref(*real)
    q = torch.cat((batch.q, torch.full_like(batch.q[:2], float("nan"))))  # padding rows' q: never read
    seq_lens = torch.cat((batch.seq_lens, torch.zeros_like(batch.seq_lens[:2])))
    tables = torch.cat((batch.block_tables, torch.zeros_like(batch.block_tables[:2])))
    poison_allocator(q.shape, q.dtype, q.device)
    out = paged_decode_attention(q, batch.k_cache, batch.v_cache, tables, seq_lens, 0.125, num_splits=num_splits,
                                 merge=merge)  # fmt: skip
    torch.testing.assert_close(out[:3], ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))
    assert int(ticket_counters(5 * 2, batch.q.device).abs().sum()) == 0


def test_split_merge_tickets_return_to_zero(paged_batch):
    """The last split of each group merges and resets its counter, so a second call (and the
    next layer's) starts from zero and merges again."""
    batch = paged_batch([1, 1, 1], [70, 5, 33], 8, 2, 64, 16, torch.float32)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.125)
    ref = paged_decode_attention_ref(*args)
    for _ in range(2):
        out = paged_decode_attention(*args, num_splits=5, merge="last_split")
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        assert int(ticket_counters(1, batch.q.device).abs().sum()) == 0


@pytest.mark.parametrize("num_splits,merge", [(1, None), (4, "last_split"), (4, "kernel")],
                         ids=["1_split", "4_splits-last_split", "4_splits-kernel"])  # fmt: skip
@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_in_length_order_writes_each_sequence_its_own_row(case, num_splits, merge, paged_batch):
    """`order` only changes which program takes which sequence (longest first, every KV head of one
    sequence together): each output row stays its sequence's, for the sort the engine passes and for an
    arbitrary permutation (a row written at its rank would swap two sequences' outputs)."""
    context_lens, num_heads, num_kv_heads, head_dim, block_size = case
    batch = paged_batch([1] * len(context_lens), context_lens, num_heads, num_kv_heads, head_dim, block_size,
                        torch.float32)  # fmt: skip
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 1.0 / math.sqrt(head_dim))
    ref = paged_decode_attention_ref(*args)
    shuffled = torch.randperm(len(context_lens), generator=torch.Generator().manual_seed(3)).to(batch.q.device)
    by_length = length_order(batch.seq_lens)
    assert batch.seq_lens[by_length].tolist() == sorted(batch.seq_lens.tolist(), reverse=True)
    for order in (by_length, shuffled.to(torch.int32)):
        out = paged_decode_attention(*args, num_splits=num_splits, merge=merge, order=order)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="order must be an integer"):
        paged_decode_attention(*args, order=by_length[:-1] if len(context_lens) > 1 else by_length.float())


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA GPU")
def test_split_decode_in_a_cuda_graph_merges_on_every_replay(paged_batch):
    batch = paged_batch([1] * 4, [3000, 17, 700, 4095], 32, 8, 128, 16, torch.bfloat16)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 1 / math.sqrt(128))
    paged_decode_attention(*args, num_splits=9)  # compile and allocate outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        paged_decode_attention(*args, num_splits=9)  # the capture stream's counters, before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = paged_decode_attention(*args, num_splits=9)
    for _ in range(3):
        batch.q.copy_(torch.randn_like(batch.q))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, paged_decode_attention_ref(*args), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA GPU")
def test_counters_are_never_first_made_inside_a_capture(paged_batch):
    """Made during a capture they would sit in the graph pool, where another graph's temporaries
    can overwrite them: the launcher refuses and says to warm up on the capture stream."""
    batch = paged_batch([1] * 2, [300, 40], 32, 8, 128, 16, torch.bfloat16)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 1 / math.sqrt(128))
    paged_decode_attention(*args, num_splits=4)  # compiled, and counters for the default stream only
    fresh = torch.cuda.Stream()
    fresh.wait_stream(torch.cuda.current_stream())
    capture = torch.cuda.graph(torch.cuda.CUDAGraph(), stream=fresh)
    with pytest.raises(RuntimeError, match="warm up on the capture stream"), capture:
        paged_decode_attention(*args, num_splits=4)
    torch.cuda.synchronize()


def test_split_count_fills_the_gpu_and_stays_static(device):
    if device.type != "cuda":
        assert choose_num_splits(1, 8, device) == 3
        return
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    assert choose_num_splits(1, 8, device) * 8 >= sms  # B=1: the context is split to fill the SMs
    assert choose_num_splits(256, 8, device) == 1  # a large batch needs no split


def test_split_and_early_tile_rules_at_an_h100s_sm_count(monkeypatch):
    """The CUDA branches of choose_num_splits and reads_first_tile_early, on any machine: 132 SMs."""
    import kernels.decode_grid as decode

    monkeypatch.setattr(decode, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    # about two programs an SM (Hkv = 8): 33 splits at batch 1, 3 at 16, none where S * Hkv fills the GPU
    assert [decode.choose_num_splits(s, 8, cuda) for s in (1, 16, 33, 64, 256)] == [33, 3, 1, 1, 1]
    # the first tile before the wait only in split grids of S * Hkv <= SMs (at most 3 programs an SM)
    assert decode.reads_first_tile_early(1, 8, 33, cuda)
    assert decode.reads_first_tile_early(16, 8, 3, cuda)  # 128 <= 132
    assert not decode.reads_first_tile_early(17, 8, 2, cuda)  # 136 > 132
    assert not decode.reads_first_tile_early(64, 8, 1, cuda)  # one split: nothing to overlap, registers kept
    assert decode.reads_first_tile_early(1, 8, 3, torch.device("cpu"))  # the interpreter runs the early path
    # longest first only in one-split grids of more than one wave (over 4 programs an SM: S * 8 > 528)
    assert [decode.wants_length_order(s, 8, cuda) for s in (1, 16, 33, 66, 67, 256)] == [False] * 4 + [True] * 2
    assert decode.wants_length_order(2, 8, torch.device("cpu")) == interpreting()  # the CPU tests take the path
    assert not decode.wants_length_order(1, 8, cuda)


def _dense_attention_float64(q, k, v, scale):
    """Naive causal attention in float64 for one sequence: q [Q, H, D], k/v [L, H, D], queries at the end."""
    q_len, seq_len = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    visible = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - q_len, seq_len)[:, None]
    scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())


def test_prefill_reference_matches_float64_dense_attention(paged_batch):
    batch = paged_batch([5, 3], [4, 0], 4, 2, 32, 4, torch.float32)
    out = paged_prefill_attention_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                      batch.query_start_loc, 0.3)  # fmt: skip
    for s, (q_len, seq_len) in enumerate(zip(batch.query_lens_cpu, batch.seq_lens_cpu)):
        start = int(batch.query_start_loc[s])
        pos = torch.arange(seq_len, device=batch.q.device)
        blocks = batch.block_tables[s, pos // 4].long()
        k = batch.k_cache[blocks, pos % 4].repeat_interleave(2, dim=1)  # [L, Hq, D]
        v = batch.v_cache[blocks, pos % 4].repeat_interleave(2, dim=1)
        expected = _dense_attention_float64(batch.q[start : start + q_len], k, v, 0.3)
        torch.testing.assert_close(out[start : start + q_len].double(), expected, atol=1e-5, rtol=1e-5)


def test_attention_rejects_what_it_does_not_support(paged_batch):
    batch = paged_batch([3], [0], 6, 4, 64, 16, torch.float32)  # 6 query heads over 4 KV heads
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_decode_attention(batch.q[:1], batch.k_cache, batch.v_cache, batch.block_tables[:1],
                               batch.seq_lens[:1], 0.1)  # fmt: skip
    with pytest.raises(ValueError, match="share a dtype"):
        paged_prefill_attention(batch.q.half(), batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                batch.query_start_loc, 3, 0.1)  # fmt: skip


@pytest.mark.parametrize("fresh_keys", [1, 5])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_attention_with_fresh_keys_matches_reference(fresh_keys, num_splits, paged_batch):
    """fresh_keys moves the newest positions' loads after the PDL wait (the early first tile of split grids): the
    same keys are read either way, over contexts shorter than, inside and past the first tile."""
    batch = paged_batch([1] * 4, [3, 40, 64, 300], 8, 2, 64, 16, torch.float32)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.125)
    out = paged_decode_attention(*args, num_splits=num_splits, fresh_keys=fresh_keys)
    torch.testing.assert_close(out, paged_decode_attention_ref(*args), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="fresh_keys must be >= 1, got 0"):
        paged_decode_attention(*args, fresh_keys=0)
