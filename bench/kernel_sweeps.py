"""Tile sweeps of the attention kernels (`python -m bench.kernels --sweep`): the data behind
the default tile sizes and the decode split heuristic, measured on the GPU at hand.

Legend as in attention_suites.py. Every variant runs on the same inputs as the main
suites' shapes (GQA 32/8, D = 128, bf16, block 16).
"""

from __future__ import annotations

import math

import torch

from bench.attention_suites import paged_pool
from bench.kernel_math import decode_kv_bytes, prefill_flops
from bench.kernel_timing import Bench, gbps, tflops
from kernels.decode_attention import choose_num_splits, paged_decode_attention
from kernels.prefill_attention import paged_prefill_attention

# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first two are the launcher's defaults for
# D = 128 (queries below 4k, and from 4k)
PREFILL_TILES = [(128, 32, 4, 4), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 8, 4),
                 (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)]  # fmt: skip
# (BLOCK_N, num_warps, num_stages); the first is the default
DECODE_TILES = [(64, 4, 3), (128, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 4), (64, 8, 4), (128, 4, 2)]
PROGRAMS_PER_SM = (1, 2, 4, 8)


def sweep_prefill(bench: Bench, seq_lens, total_tokens: int = 16384, num_heads: int = 32, num_kv_heads: int = 8,
                  head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
                  tile_list=PREFILL_TILES) -> list[dict]:  # fmt: skip
    rows = []
    scale = 1.0 / math.sqrt(head_dim)
    for seq_len in seq_lens:
        batch = total_tokens // seq_len
        q = torch.randn(batch * seq_len, num_heads, head_dim, device=bench.device).to(dtype)
        k = torch.randn(batch, seq_len, num_kv_heads, head_dim, device=bench.device).to(dtype)
        kv_cache, block_tables = paged_pool(k, torch.randn_like(k), 16)
        seq_lens_t = torch.full((batch,), seq_len, dtype=torch.int32, device=bench.device)
        query_start_loc = torch.arange(0, batch * seq_len + 1, seq_len, dtype=torch.int32, device=bench.device)
        inputs = [(q, kv_cache[0], kv_cache[1], block_tables, seq_lens_t, query_start_loc, seq_len, scale)]
        expected = paged_prefill_attention(*inputs[0])
        for block_m, block_n, warps, stages in tile_list:
            tiles = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
            row = {"S": seq_len, **tiles}
            try:
                ms = bench.time_ms(lambda *a, tiles=tiles: paged_prefill_attention(*a, tiles=tiles), inputs)
                diff = (paged_prefill_attention(*inputs[0], tiles=tiles) - expected).abs().max()
                row.update(tflops=tflops(prefill_flops(batch, seq_len, num_heads, head_dim), ms), max_diff=float(diff))
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is a result, not a crash
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
        del q, k, kv_cache, inputs, expected
        bench.free()
    return rows


def sweep_decode(bench: Bench, cases, num_heads: int = 32, num_kv_heads: int = 8, head_dim: int = 128,
                 dtype: torch.dtype = torch.bfloat16, tile_list=DECODE_TILES) -> list[dict]:  # fmt: skip
    rows = []
    scale = 1.0 / math.sqrt(head_dim)
    for batch, context in cases:
        nbytes = decode_kv_bytes(batch, context, num_kv_heads, head_dim, torch.finfo(dtype).bits // 8)
        inputs = []
        for _ in range(bench.rotations(nbytes)):
            k = torch.randn(batch, context, num_kv_heads, head_dim, device=bench.device).to(dtype)
            kv_cache, block_tables = paged_pool(k, torch.randn_like(k), 16)
            q = torch.randn(batch, num_heads, head_dim, device=bench.device).to(dtype)
            seq_lens = torch.full((batch,), context, dtype=torch.int32, device=bench.device)
            inputs.append((q, kv_cache[0], kv_cache[1], block_tables, seq_lens, scale))
        splits = sorted({choose_num_splits(batch, num_kv_heads, bench.device, p) for p in PROGRAMS_PER_SM})
        for block_n, warps, stages in tile_list:
            tiles = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
            for num_splits in splits:
                row = {"B": batch, "L": context, **tiles, "splits": num_splits}

                def decode(*args, tiles=tiles, num_splits=num_splits):
                    return paged_decode_attention(*args, num_splits=num_splits, tiles=tiles)

                try:
                    ms, timing = bench.measure(decode, inputs, graph=True)
                    row.update(us=ms * 1e3, gbps=gbps(nbytes, ms), timing=timing)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(row)
        del inputs
        bench.free()
    return rows
