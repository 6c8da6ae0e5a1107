"""Programmatic dependent launch (kernels/_pdl.py): when it is on, and that a chain of dependent
kernels launched with it, replayed from a CUDA graph on new inputs, gives bit for bit what the
same kernels give launched in plain stream order (a kernel reading before its wait would read
the previous replay's activations). Decode attention reads the K/V of earlier positions before its
wait: a chain of decode layers checks that it reads the newest token's only after."""

from __future__ import annotations

import pytest
import torch

from kernels._pdl import parse_pdl_setting, pdl_requested, set_pdl, use_pdl

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.fixture
def pdl_setting():
    yield set_pdl
    set_pdl(None)


def test_setting_parses_on_and_off_and_names_the_variable():
    assert parse_pdl_setting("1") and parse_pdl_setting(" On ") and parse_pdl_setting("true")
    assert not parse_pdl_setting("0") and not parse_pdl_setting("off")
    with pytest.raises(ValueError, match="INFERQ_PDL must be 0 or 1, got 'maybe'"):
        parse_pdl_setting("maybe")


def test_override_beats_the_environment_and_cpu_never_uses_it(pdl_setting):
    pdl_setting(False)
    assert not pdl_requested()
    pdl_setting(True)
    assert pdl_requested()
    assert not use_pdl(torch.device("cpu"))  # the interpreter has no griddepcontrol


def _chain(x, residual, layers):
    """A decoder-like chain of one-token kernels, each reading the one before's output."""
    from kernels.gemv import gemv
    from kernels.rms_norm import fused_add_rms_norm
    from kernels.rms_norm_gemv import rms_norm_gemv
    from kernels.silu_and_mul import silu_and_mul

    for norm_w, w_in, w_out in layers:
        y, residual = rms_norm_gemv(x, residual, norm_w, 1e-5, w_in, swiglu=True)  # SwiGLU inside
        y = gemv(y, w_out)
        normed, residual = fused_add_rms_norm(y, residual, norm_w, 1e-5)
        x = gemv(silu_and_mul(gemv(normed, w_in)), w_out)
    return x, residual


@pytest.mark.skipif(not ON_HOPPER, reason="programmatic dependent launch needs an sm_90+ GPU")
def test_dependent_chain_in_a_cuda_graph_equals_stream_order(pdl_setting):
    torch.manual_seed(0)
    hidden, inter = 4096, 4096
    layers = [
        (
            1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16),
            (torch.randn(2 * inter, hidden, device="cuda") / hidden**0.5).to(torch.bfloat16),
            (torch.randn(hidden, inter, device="cuda") / inter**0.5).to(torch.bfloat16),
        )
        for _ in range(6)
    ]
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)

    pdl_setting(True)
    assert use_pdl(x.device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _chain(x, residual, layers)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out, out_residual = _chain(x, residual, layers)

    for _ in range(4):
        x.copy_(torch.randn_like(x))
        residual.copy_(torch.randn_like(residual))
        graph.replay()
        torch.cuda.synchronize()
        pdl_setting(False)
        want, want_residual = _chain(x, residual, layers)
        pdl_setting(True)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(out_residual, want_residual)


@pytest.mark.skipif(not ON_HOPPER, reason="programmatic dependent launch needs an sm_90+ GPU")
def test_kernels_are_compiled_with_the_launch_attribute_only_when_on(pdl_setting):
    from kernels.gemv import _gemv_kernel, gemv

    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16)
    for enabled in (True, False):
        pdl_setting(enabled)
        gemv(x, w)
    compiled = _gemv_kernel.device_caches[torch.cuda.current_device()][0].values()
    assert {kernel.metadata.launch_pdl for kernel in compiled} >= {True, False}


def _decode_layers(x, layers, batch, cos_sin, positions, slots, num_heads, num_kv_heads, head_dim, fresh_keys=1):
    """Decode layers of S rows, one token each, over one pool: qkv projection (cuBLAS), RoPE + KV
    store of the newest tokens, paged decode attention (launched with PDL after the store), o projection."""
    from kernels.decode_attention import paged_decode_attention
    from kernels.rope_store_kv import rope_store_kv

    num_seqs = x.shape[0]
    for w_qkv, w_o in layers:
        qkv = x @ w_qkv.T  # [S, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
        q = q.reshape(num_seqs, num_heads, head_dim)
        k = k.reshape(num_seqs, num_kv_heads, head_dim)
        v = v.reshape(num_seqs, num_kv_heads, head_dim)
        rope_store_kv(q, k, v, positions, cos_sin, batch.k_cache, batch.v_cache, slots)
        out = paged_decode_attention(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                     head_dim**-0.5, fresh_keys=fresh_keys)  # fmt: skip
        x = x + out.reshape(num_seqs, -1) @ w_o.T
    return x


def _replays_equal_stream_order(pdl_setting, x, args) -> None:
    """Captures _decode_layers(x, *args) with PDL in a CUDA graph and checks 8 replays over new inputs against the
    same layers launched without PDL (stream order)."""
    pdl_setting(True)
    assert use_pdl(x.device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _decode_layers(x, *args)  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = _decode_layers(x, *args)
    for _ in range(8):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        pdl_setting(False)
        want = _decode_layers(x, *args)
        pdl_setting(True)
        torch.cuda.synchronize()
        assert torch.isfinite(want).all() and torch.equal(out, want)


@pytest.mark.skipif(not ON_HOPPER, reason="programmatic dependent launch needs an sm_90+ GPU")
def test_decode_attention_reads_the_newest_kv_only_after_its_wait(pdl_setting, paged_batch):
    """Every layer of every replay stores new K/V for each sequence's newest token; an attention that read
    them before its wait would see the layer before's (or the previous replay's). The contexts put the
    newest token first, last and inside a 64-key tile, in one-tile and two-tile splits."""
    from tests.kernels.test_rope import cos_sin_cache

    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim, hidden, block_size = 32, 8, 64, 2048, 64
    seq_lens = [1, 2, 64, 65, 130, 640]
    num_seqs = len(seq_lens)
    batch = paged_batch([1] * num_seqs, [n - 1 for n in seq_lens], num_heads, num_kv_heads, head_dim, block_size,
                        torch.bfloat16)  # fmt: skip
    layers = [
        (
            (torch.randn((num_heads + 2 * num_kv_heads) * head_dim, hidden, device="cuda") / hidden**0.5).bfloat16(),
            (torch.randn(hidden, num_heads * head_dim, device="cuda") / hidden**0.5).bfloat16(),
        )
        for _ in range(6)
    ]
    positions = torch.tensor([n - 1 for n in seq_lens], device="cuda")
    tables = batch.block_tables.long()
    slots = tables[torch.arange(num_seqs, device="cuda"), positions // block_size] * block_size + positions % block_size
    x = torch.randn(num_seqs, hidden, device="cuda").bfloat16()
    args = (layers, batch, cos_sin_cache(head_dim, "cuda"), positions, slots, num_heads, num_kv_heads,
            head_dim)  # fmt: skip

    _replays_equal_stream_order(pdl_setting, x, args)


@pytest.mark.skipif(not ON_HOPPER, reason="programmatic dependent launch needs an sm_90+ GPU")
@pytest.mark.parametrize("context", [60, 126, 640])
def test_decode_rows_of_one_sequence_read_every_key_of_their_step_only_after_the_wait(pdl_setting, paged_batch,
                                                                                      context):  # fmt: skip
    """A verification step as decode rows (engine/verify_rows.py): rows 0..R-1 of one sequence at positions
    L..L+R-1 over one block table, each layer storing all R keys before the attention reads them; row j reads
    keys L..L+j of this step, so the attention (fresh_keys=R) must load every one of them after its wait. The
    contexts put the new keys inside one tile, across a tile's end, and in a long split."""
    from tests.kernels.test_rope import cos_sin_cache

    torch.manual_seed(1)
    num_heads, num_kv_heads, head_dim, hidden, block_size, rows = 32, 8, 64, 2048, 64, 5
    batch = paged_batch([1] * rows, [context + rows] * rows, num_heads, num_kv_heads, head_dim, block_size,
                        torch.bfloat16)  # fmt: skip
    batch.block_tables[1:] = batch.block_tables[0]  # every row is the same sequence
    batch.seq_lens.copy_(torch.arange(context + 1, context + rows + 1, device="cuda", dtype=batch.seq_lens.dtype))
    layers = [
        (
            (torch.randn((num_heads + 2 * num_kv_heads) * head_dim, hidden, device="cuda") / hidden**0.5).bfloat16(),
            (torch.randn(hidden, num_heads * head_dim, device="cuda") / hidden**0.5).bfloat16(),
        )
        for _ in range(6)
    ]
    positions = torch.arange(context, context + rows, device="cuda")
    table = batch.block_tables[0].long()
    slots = table[positions // block_size] * block_size + positions % block_size
    x = torch.randn(rows, hidden, device="cuda").bfloat16()
    args = (layers, batch, cos_sin_cache(head_dim, "cuda"), positions, slots, num_heads, num_kv_heads, head_dim,
            rows)  # fmt: skip

    _replays_equal_stream_order(pdl_setting, x, args)
