"""Prefill and decode attention benchmarks: inferq's paged kernels against torch SDPA.

Legend: B = sequences, S = sequence length (prefill), L = context length (decode),
Hq/Hkv = query/KV heads, D = head dim. K/V of the inferq kernels sit in a paged pool
[2, N, block, Hkv, D] with shuffled block ids; SDPA reads the same values from
contiguous [B, H, S, D] tensors. Each row also reports the largest difference between
the two outputs, so a fast but wrong kernel cannot go unnoticed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.kernel_math import decode_kv_bytes, prefill_flops
from bench.kernel_timing import Bench, gbps, tflops
from engine.config import CacheConfig
from kernels.decode_attention import paged_decode_attention
from kernels.decode_grid import choose_num_splits
from kernels.decode_split_merge import MERGES, choose_merge
from kernels.prefill_attention import paged_prefill_attention

# The engine's block size unless a run asks for another (bench.kernels --block-size): the kernels
# choose tiles and load paths from it.
POOL_BLOCK_SIZE = CacheConfig.block_size


def paged_pool(k: torch.Tensor, v: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [B, L, Hkv, D] -> (kv_cache [2, N, block, Hkv, D], block_tables [B, M]) with shuffled block ids."""
    batch, length, num_kv_heads, head_dim = k.shape
    blocks_per_seq = -(-length // block_size)
    num_blocks = batch * blocks_per_seq
    block_tables = torch.randperm(num_blocks, device=k.device).view(batch, blocks_per_seq).to(torch.int32)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, device=k.device).to(k.dtype)
    pos = torch.arange(length, device=k.device)
    slots = (block_tables[:, pos // block_size].long() * block_size + pos % block_size).flatten()  # [B * L]
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    flat[0, slots] = k.reshape(-1, num_kv_heads, head_dim)
    flat[1, slots] = v.reshape(-1, num_kv_heads, head_dim)
    return kv_cache, block_tables


def _sdpa_peers(bench: Bench) -> list[tuple[str, SDPBackend]]:
    if bench.dry_run:  # flash and cuDNN exist only on CUDA
        return [("sdpa_math", SDPBackend.MATH)]
    return [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]


def _time_sdpa(
    bench: Bench, backend: SDPBackend, inputs: list[tuple], graph: bool = False, **kwargs
) -> tuple[float, torch.Tensor, str]:
    """(ms, output of the first input, note) of SDPA on one backend, GQA native where it runs, else heads repeated."""

    def with_gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)

    def repeated(q, k, v):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), **kwargs)

    with sdpa_kernel(backend):
        try:
            out = with_gqa(*inputs[0])
            ms, timing = bench.measure(with_gqa, inputs, graph)
            return ms, out, f"enable_gqa, {timing}"
        except RuntimeError:
            # NOTE: the repeat is inside the timed call: this backend cannot read grouped K/V
            out = repeated(*inputs[0])
            ms, timing = bench.measure(repeated, inputs, graph)
            return ms, out, f"K/V heads repeated in the call, {timing}"


def prefill_suite(bench: Bench, seq_lens, total_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
                  block_size: int = POOL_BLOCK_SIZE, dtype: torch.dtype = torch.bfloat16) -> list[dict]:  # fmt: skip
    """Causal prefill of total_tokens split into B = total_tokens // S sequences of length S, no cached prefix."""
    rows = []
    scale = 1.0 / math.sqrt(head_dim)
    for seq_len in seq_lens:
        batch = total_tokens // seq_len
        q = torch.randn(batch, seq_len, num_heads, head_dim, device=bench.device).to(dtype)
        k = torch.randn(batch, seq_len, num_kv_heads, head_dim, device=bench.device).to(dtype)
        v = torch.randn(batch, seq_len, num_kv_heads, head_dim, device=bench.device).to(dtype)
        kv_cache, block_tables = paged_pool(k, v, block_size)
        seq_lens_t = torch.full((batch,), seq_len, dtype=torch.int32, device=bench.device)
        query_start_loc = torch.arange(0, batch * seq_len + 1, seq_len, dtype=torch.int32, device=bench.device)
        q_flat = q.view(batch * seq_len, num_heads, head_dim)  # [T, Hq, D]
        ours_inputs = [(q_flat, kv_cache[0], kv_cache[1], block_tables, seq_lens_t, query_start_loc, seq_len, scale)]
        flops = prefill_flops(batch, seq_len, num_heads, head_dim)
        ms = bench.time_ms(paged_prefill_attention, ours_inputs)
        out = paged_prefill_attention(*ours_inputs[0]).view(batch, seq_len, num_heads, head_dim)
        row = {"S": seq_len, "B": batch, "inferq_ms": ms, "inferq_tflops": tflops(flops, ms)}
        peer_inputs = [tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))]  # [B, H, S, D]
        for name, backend in _sdpa_peers(bench):
            try:
                peer_ms, peer_out, note = _time_sdpa(bench, backend, peer_inputs, is_causal=True, scale=scale)
            except RuntimeError as e:
                row[f"{name}_error"] = str(e).splitlines()[0][:200]
                continue
            row[f"{name}_tflops"] = tflops(flops, peer_ms)
            row[f"inferq_vs_{name}"] = peer_ms / ms
            row[f"{name}_note"] = note
            row[f"max_abs_diff_vs_{name}"] = float((out - peer_out.transpose(1, 2)).abs().max())
        rows.append(row)
        del q, k, v, kv_cache, ours_inputs, peer_inputs, out
        bench.free()
    return rows


def decode_suite(bench: Bench, cases, num_heads: int, num_kv_heads: int, head_dim: int,
                 block_size: int = POOL_BLOCK_SIZE, dtype: torch.dtype = torch.bfloat16,
                 window: int | None = None) -> list[dict]:  # fmt: skip
    """One query per sequence over a context of L tokens, for each (B, L).

    window: a sliding window of that many keys; bandwidth counts the bytes inside it (what the kernel must read),
    and the SDPA peer reads the window's keys from contiguous tensors (the best a dense kernel could do).
    """
    rows = []
    scale = 1.0 / math.sqrt(head_dim)
    elem = torch.finfo(dtype).bits // 8
    for batch, context in cases:
        seen = context if window is None else min(context, window)
        nbytes = decode_kv_bytes(batch, seen, num_kv_heads, head_dim, elem)
        ours_inputs, peer_inputs = [], []
        for _ in range(bench.rotations(nbytes)):
            k = torch.randn(batch, context, num_kv_heads, head_dim, device=bench.device).to(dtype)
            v = torch.randn(batch, context, num_kv_heads, head_dim, device=bench.device).to(dtype)
            kv_cache, block_tables = paged_pool(k, v, block_size)
            q = torch.randn(batch, num_heads, head_dim, device=bench.device).to(dtype)
            seq_lens = torch.full((batch,), context, dtype=torch.int32, device=bench.device)
            ours_inputs.append((q, kv_cache[0], kv_cache[1], block_tables, seq_lens))
            k, v = k[:, context - seen :], v[:, context - seen :]  # the window's keys (all of them without one)
            peer_inputs.append((q.unsqueeze(2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()))
            del k, v

        def ours(q, k_cache, v_cache, block_tables, seq_lens):
            return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, window=window)

        ms, timing = bench.measure(ours, ours_inputs, graph=True)
        out = ours(*ours_inputs[0])
        row = {
            "B": batch,
            "L": context,
            **({"window": window} if window is not None else {}),
            "splits": choose_num_splits(batch, num_kv_heads, bench.device),
            "rotations": len(ours_inputs),
            "kv_bytes": nbytes,
            "inferq_us": ms * 1e3,
            "inferq_gbps": gbps(nbytes, ms),
            "inferq_timing": timing,
        }
        if row["splits"] > 1:  # the other merge, same inputs: the data behind choose_merge
            row["merge"] = choose_merge(head_dim)
            other = next(m for m in MERGES if m != row["merge"])

            def ours_other(q, k_cache, v_cache, block_tables, seq_lens, other=other):
                return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, merge=other,
                                              window=window)  # fmt: skip

            other_ms, _ = bench.measure(ours_other, ours_inputs, graph=True)
            row.update(other_merge=other, other_merge_us=other_ms * 1e3)
        name, backend = _sdpa_peers(bench)[0]
        try:
            peer_ms, peer_out, note = _time_sdpa(bench, backend, peer_inputs, graph=True, scale=scale)
            row.update({f"{name}_us": peer_ms * 1e3, f"{name}_gbps": gbps(nbytes, peer_ms),
                        f"inferq_vs_{name}": peer_ms / ms, f"{name}_note": note,
                        f"max_abs_diff_vs_{name}": float((out - peer_out.squeeze(2)).abs().max())})  # fmt: skip
        except RuntimeError as e:
            row[f"{name}_error"] = str(e).splitlines()[0][:200]
        rows.append(row)
        del ours_inputs, peer_inputs, out
        bench.free()
    return rows
