"""Tile sweeps of the attention kernels (`python -m bench.kernels --sweep`): the data behind
the default tile sizes and the decode split heuristic, measured on the GPU at hand.

Legend as in attention_suites.py. Every variant runs on the same inputs as the main
suites' shapes (GQA 32/8, D = 128, bf16, block 16).
"""

from __future__ import annotations

import itertools
import math

import torch

from bench.attention_suites import paged_pool
from bench.kernel_math import decode_kv_bytes, prefill_flops
from bench.kernel_timing import Bench, gbps, tflops
from kernels.decode_attention import paged_decode_attention
from kernels.decode_grid import choose_num_splits
from kernels.prefill_attention import paged_prefill_attention

# (BLOCK_M, BLOCK_N, num_warps, num_stages), or a dict of paged_prefill_attention's `tiles`; the
# first two are the launcher's defaults for D = 128 (queries below 4k, and from 4k)
PREFILL_POINTER_TILE = dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=4, USE_TMA=False)
PREFILL_TILES = [(128, 32, 4, 4), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 8, 4),
                 (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)]  # fmt: skip
# (BLOCK_N, num_warps, num_stages); the first is the default
DECODE_TILES = [(64, 4, 3), (128, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 4), (64, 8, 4), (128, 4, 2)]
PROGRAMS_PER_SM = (1, 2, 4, 8)


def sweep_prefill(bench: Bench, seq_lens, total_tokens: int = 16384, num_heads: int = 32, num_kv_heads: int = 8,
                  head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
                  tile_list=PREFILL_TILES, block_size: int = 16) -> list[dict]:  # fmt: skip
    rows = []
    scale = 1.0 / math.sqrt(head_dim)
    for seq_len in seq_lens:
        batch = total_tokens // seq_len
        q = torch.randn(batch * seq_len, num_heads, head_dim, device=bench.device).to(dtype)
        k = torch.randn(batch, seq_len, num_kv_heads, head_dim, device=bench.device).to(dtype)
        kv_cache, block_tables = paged_pool(k, torch.randn_like(k), block_size)
        seq_lens_t = torch.full((batch,), seq_len, dtype=torch.int32, device=bench.device)
        query_start_loc = torch.arange(0, batch * seq_len + 1, seq_len, dtype=torch.int32, device=bench.device)
        inputs = [(q, kv_cache[0], kv_cache[1], block_tables, seq_lens_t, query_start_loc, seq_len, scale)]
        expected = paged_prefill_attention(*inputs[0], tiles=dict(PREFILL_POINTER_TILE))  # pointer gathers
        for entry in tile_list:
            # a tuple is a tile of the pointer gathers (the launcher would take TMA boxes where the pool allows)
            tiles = entry if isinstance(entry, dict) else dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
                                                                     entry, strict=True), USE_TMA=False)  # fmt: skip
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


def head_major(kv_cache: torch.Tensor) -> torch.Tensor:
    """The same pool values stored [2, N, Hkv, B, D] (a block's keys of one head contiguous), seen as
    the [2, N, B, Hkv, D] view the kernels take: the layout experiment of the decode sweep."""
    return kv_cache.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)


def default_splits(batch: int, num_kv_heads: int, device: torch.device) -> list[int]:
    return sorted({choose_num_splits(batch, num_kv_heads, device, p) for p in PROGRAMS_PER_SM})


def sweep_decode(bench: Bench, cases, num_heads: int = 32, num_kv_heads: int = 8, head_dim: int = 128,
                 dtype: torch.dtype = torch.bfloat16, tile_list=DECODE_TILES, splits_for=default_splits,
                 layouts=("token_major",)) -> list[dict]:  # fmt: skip
    """A row per (case, tile, splits, pool layout): GB/s of K+V read, and the largest difference
    from the default launch on the same inputs."""
    rows = []
    scale = 1.0 / math.sqrt(head_dim)
    for batch, context in cases:
        nbytes = decode_kv_bytes(batch, context, num_kv_heads, head_dim, torch.finfo(dtype).bits // 8)
        base = []
        for _ in range(bench.rotations(nbytes)):
            k = torch.randn(batch, context, num_kv_heads, head_dim, device=bench.device).to(dtype)
            kv_cache, block_tables = paged_pool(k, torch.randn_like(k), 16)
            q = torch.randn(batch, num_heads, head_dim, device=bench.device).to(dtype)
            seq_lens = torch.full((batch,), context, dtype=torch.int32, device=bench.device)
            base.append((q, kv_cache, block_tables, seq_lens))
            del k
        expected = paged_decode_attention(base[0][0], base[0][1][0], base[0][1][1], *base[0][2:], scale)
        for layout in layouts:
            inputs = []
            for q, kv_cache, block_tables, seq_lens in base:
                pool = head_major(kv_cache) if layout == "head_major" else kv_cache
                inputs.append((q, pool[0], pool[1], block_tables, seq_lens, scale))
            for (block_n, warps, stages), num_splits in itertools.product(
                tile_list, splits_for(batch, num_kv_heads, bench.device)
            ):
                tiles = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
                row = {"B": batch, "L": context, "layout": layout, **tiles, "splits": num_splits}

                def decode(*args, tiles=tiles, num_splits=num_splits):
                    return paged_decode_attention(*args, num_splits=num_splits, tiles=tiles)

                try:
                    ms, timing = bench.measure(decode, inputs, graph=True)
                    diff = (decode(*inputs[0]).float() - expected.float()).abs().max()
                    row.update(us=ms * 1e3, gbps=gbps(nbytes, ms), timing=timing, max_diff=float(diff))
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(row)
            del inputs
        del base, expected
        bench.free()
    return rows
