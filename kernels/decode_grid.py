"""The shape of decode attention's grid (kernels/decode_attention.py): how many context splits a
batch takes, whether its sequences run longest context first, and whether programs read their first
key tile before the PDL wait. Each rule is a measurement on an H100; they read the SM count, so the CPU
interpreter (no SMs) takes fixed choices that keep every path under test.
"""

from __future__ import annotations

import torch
import triton

from kernels._launch import interpreting, num_sms

MAX_SPLITS = 64
# Longest context first only where a one-split grid holds more than this many programs an SM
# (wants_length_order): more than one wave of the kernel's programs (4 fit an SM at 124-126 registers).
ORDER_MIN_PROGRAMS_PER_SM = 4
INTERPRETER_SPLITS = 3  # the CPU interpreter has no SM count; 3 keeps the split path under test
PROGRAMS_PER_SM = 2


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, device: torch.device, programs_per_sm: int = PROGRAMS_PER_SM
) -> int:
    """Context splits per sequence: about programs_per_sm programs per SM, 1 when S * Hkv fills the GPU.

    Two per SM measured best of 1 / 2 / 4 / 8 on an H100 (bf16, GQA 32/8, D = 128):
    B = 1, L = 64k: 1879 / 2376 / 2095 GB/s at 17 / 33 / 64 splits; B = 16, L = 4k:
    2413 / 2449 / 2343 / 2309 GB/s at 2 / 3 / 5 / 9 splits (`python -m bench.kernels --sweep`).
    """
    if device.type != "cuda":
        return INTERPRETER_SPLITS
    programs = num_seqs * num_kv_heads
    target = programs_per_sm * num_sms(device)
    return max(1, min(MAX_SPLITS, triton.cdiv(target, programs)))


def wants_length_order(num_seqs: int, num_kv_heads: int, device: torch.device) -> bool:
    """Whether a decode batch should be taken longest context first (paged_decode_attention's order):
    where its programs take one split each, so a program's time is its sequence's length, and are more
    than one wave (over ORDER_MIN_PROGRAMS_PER_SM an SM), so a long sequence dispatched late is the
    kernel's tail. Under the interpreter whenever S > 1, so that the CPU tests take the path.

    H100, Qwen3-0.6B heads, lengths uniform in [100, 2048], us (bench/results/h100/decode_session18/,
    calls 7-8): B = 256 388 -> 369 (91% -> 96% of the read bandwidth; the same keys in equal lengths:
    372), B = 128 215 -> 190, B = 96 173 -> 156; but B = 64, 512 programs, all resident at once,
    118 -> 126, so it keeps the batch's order there. Offline Qwen3-0.6B, alternating with the tree
    before: 19,313-19,474 -> 19,713-20,001 output tok/s, the decode steps' GPU 7.12-7.13 -> 6.92-6.96 s.
    """
    if num_seqs < 2:
        return False
    if device.type != "cuda":
        return interpreting()
    more_than_a_wave = num_seqs * num_kv_heads > ORDER_MIN_PROGRAMS_PER_SM * num_sms(device)
    return more_than_a_wave and choose_num_splits(num_seqs, num_kv_heads, device) == 1


def length_order(seq_lens: torch.Tensor) -> torch.Tensor:
    """The sequences longest context first (a torch sort on the device: no host sync, graph-safe)."""
    return torch.argsort(seq_lens, descending=True)


def reads_first_tile_early(num_seqs: int, num_kv_heads: int, num_splits: int, device: torch.device) -> bool:
    """Whether programs load their first tile's keys before the PDL wait (kernels/_pdl.py), so that they
    stream while the kernels before finish: only in split grids of at most 3 programs an SM.

    Why: the held tile costs registers (165 against 124-126 at D = 128, bench/compile_check.py), so 3
    programs fit an SM instead of 4. H100 (bench/results/h100/decode_path_session15/): with the early
    tile everywhere, B = 1 L = 4k 14.7 -> 14.1 us and B = 16 L = 4k 97.1 -> 95.8 us, but the one-split
    grids of B = 64 L = 2k and B = 256 L = 1k fell from 97% to 82% and 93% of read bandwidth. S * Hkv
    <= SMs keeps a split grid (about PROGRAMS_PER_SM per SM, rounded up by less than one S * Hkv) within 3.
    """
    if num_splits == 1:
        return False
    return device.type != "cuda" or num_seqs * num_kv_heads <= num_sms(device)
