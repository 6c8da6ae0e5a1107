"""Which path and tiles the routed experts take (kernels/fused_moe.py), per layer shape, batch and GPU.

Legend: T = tokens, E = experts, K = experts per token, H = hidden size, I = an expert's intermediate size.

Tuned: bench/moe_tune.py times both paths and a sweep of grouped-GEMM tiles on a GPU and writes, per GPU
name, kernels/moe_configs/<GPU>.json: for each shape key (moe_shape_key) the largest T that takes the
one-token path (`small_batch_max_tokens`), the one-token kernels' tiles (`gemv`: {"gate_up": tile,
"down": tile}, swept at one token) and a tile per measured T (`grouped`, keyed by T as text). A
batch takes the tile of the nearest measured T (vLLM's rule for its tuned files), if within a factor of 2.
Elsewhere (another GPU, an untuned shape, the interpreter) a heuristic decides, without a warning: a
missing file is the normal state of a new GPU, and the heuristic is what every untuned shape runs.
- the one-token kernels: kernels/moe_gemv.py's TILE (the dense GEMV's tile, with its prefetch);
- small_batch_max_tokens = E // (2K), at least 1: while T * K pairs stay below half the experts, few
  tokens share an expert, so the one-token path streams about what the grouped GEMMs would;
- grouped tiles by rows per expert m = T K / E: BLOCK_M 16 (m <= 16), 32 (<= 32), 64 (<= 96), else 128,
  with wider columns and more warps as the tile grows (vLLM's default tiles for bf16 on Hopper-class GPUs);
  then fewer stages, and if need be a shorter BLOCK_K, until the gated GEMM's pipelined tiles (its input
  and two weight tiles a stage) fit SHARED_MEMORY_BUDGET (float32 tiles take twice bf16's, and narrower
  columns at 128 rows, MAX_WIDE_ACCUMULATOR).
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import torch

from kernels._launch import interpreting
from kernels.moe_gemv import TILE_KEYS as GEMV_TILE_KEYS

CONFIG_DIR = Path(__file__).resolve().parent / "moe_configs"
GROUPED_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
PATHS = ("gemv", "grouped")
GEMV_KERNELS = ("gate_up", "down")  # a tuned entry's `gemv` tiles; the config's keys are gemv_<kernel>
# a tuned tile serves batches within this factor of the batch it was measured at (a sweep cut short by its
# budget leaves the larger batches to the heuristic rather than to the largest measured one's tile)
NEAREST_MAX_RATIO = 2
SHARED_MEMORY_BUDGET = 160 * 1024  # bytes: under an A100's 164 KB a block (an H100 has 227 KB)
# float32 inputs (the parity tests): two [BLOCK_M, BLOCK_N] accumulators of this many elements at most, which
# 8 warps hold in registers (128 x 128 spilled on sm_90)
MAX_WIDE_ACCUMULATOR = 128 * 64
INTERPRETER_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 1}


def moe_shape_key(num_experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype) -> str:
    """The key of one layer shape in a tuned file."""
    return f"E={num_experts},K={top_k},H={hidden},I={inter},dtype={str(dtype).removeprefix('torch.')}"


def device_config_file(device_name: str) -> Path:
    """kernels/moe_configs/<the GPU's name, with characters other than letters, digits, '-' and '.' as '_'>.json."""
    return CONFIG_DIR / (re.sub(r"[^A-Za-z0-9.\-]+", "_", device_name) + ".json")


@functools.lru_cache(maxsize=8)
def tuned_table(device_name: str) -> dict:
    """The tuned file of a GPU, {} where there is none."""
    path = device_config_file(device_name)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


@functools.lru_cache(maxsize=8)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def heuristic_small_batch_max_tokens(num_experts: int, top_k: int) -> int:
    return max(1, num_experts // (2 * top_k))


def shared_bytes(tile: dict, element_bytes: int) -> int:
    """Shared memory of the gated grouped GEMM's pipeline: per stage an input tile and two weight tiles."""
    stage = tile["BLOCK_M"] * tile["BLOCK_K"] + 2 * tile["BLOCK_K"] * tile["BLOCK_N"]
    return tile["num_stages"] * stage * element_bytes


def heuristic_grouped_tile(num_tokens: int, num_experts: int, top_k: int, element_bytes: int = 2) -> dict:
    rows_per_expert = -(-num_tokens * top_k // num_experts)
    if rows_per_expert <= 16:
        tile = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}
    elif rows_per_expert <= 32:
        tile = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4, "num_warps": 4, "num_stages": 3}
    elif rows_per_expert <= 96:
        tile = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    else:
        tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    if element_bytes > 2 and tile["BLOCK_M"] * tile["BLOCK_N"] > MAX_WIDE_ACCUMULATOR:
        tile["BLOCK_N"] = MAX_WIDE_ACCUMULATOR // tile["BLOCK_M"]
    while shared_bytes(tile, element_bytes) > SHARED_MEMORY_BUDGET and tile["num_stages"] > 2:
        tile["num_stages"] -= 1
    while shared_bytes(tile, element_bytes) > SHARED_MEMORY_BUDGET and tile["BLOCK_K"] > 16:
        tile["BLOCK_K"] //= 2
    return tile


def moe_tiles(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden: int,
    inter: int,
    dtype: torch.dtype,
    device: torch.device,
    overrides: dict | None = None,
) -> dict:
    """{"path": "gemv" | "grouped", the grouped GEMMs' tile, and "gemv_gate_up" / "gemv_down": the one-token
    kernels' tiles (None: kernels/moe_gemv.py's default)} for one call; overrides replace entries."""
    entry = {}
    if device.type == "cuda" and not interpreting():
        index = device.index if device.index is not None else torch.cuda.current_device()
        entry = tuned_table(_device_name(index)).get(moe_shape_key(num_experts, top_k, hidden, inter, dtype), {})
    return choose_tiles(entry, num_tokens, num_experts, top_k, overrides, element_bytes=dtype.itemsize)


def choose_tiles(
    entry: dict,
    num_tokens: int,
    num_experts: int,
    top_k: int,
    overrides: dict | None = None,
    element_bytes: int = 2,
) -> dict:
    """moe_tiles from one shape's tuned entry ({} for none): its values where it has them, the heuristic's else
    (the one-token kernels' default tiles: None)."""
    small_max = entry.get("small_batch_max_tokens", heuristic_small_batch_max_tokens(num_experts, top_k))
    grouped = entry.get("grouped") or {}
    nearest = min(grouped, key=lambda tokens: abs(math.log(int(tokens) / num_tokens)), default=None)
    if nearest is not None and max(int(nearest), num_tokens) <= NEAREST_MAX_RATIO * min(int(nearest), num_tokens):
        tile = dict(grouped[nearest])
    elif interpreting():
        tile = dict(INTERPRETER_TILE)
    else:
        tile = heuristic_grouped_tile(num_tokens, num_experts, top_k, element_bytes)
    missing = set(GROUPED_KEYS) - set(tile)
    if missing:
        raise ValueError(f"a tuned MoE tile lacks {sorted(missing)}: {tile}")
    gemv = entry.get("gemv") or {}
    for kernel, gemv_tile in gemv.items():
        if kernel not in GEMV_KERNELS or set(gemv_tile) - set(GEMV_TILE_KEYS):
            raise ValueError(
                f"a tuned one-token MoE tile must be gemv.<{'|'.join(GEMV_KERNELS)}> with keys of {GEMV_TILE_KEYS}, "
                f"got gemv.{kernel} = {gemv_tile} (retune: bench/moe_tune.py)"
            )
    config = {"path": "gemv" if num_tokens <= small_max else "grouped", **tile}
    config.update({f"gemv_{kernel}": gemv.get(kernel) for kernel in GEMV_KERNELS})
    unknown = set(overrides or {}) - set(config)
    if unknown:
        raise ValueError(f"MoE tiles may set only {sorted(config)}, got {sorted(unknown)}")
    config.update(overrides or {})
    if config["path"] not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {config['path']!r}")
    return config
