"""The shape of decode attention's grid (kernels/decode_attention.py): how many context splits a
batch takes, whether its sequences run longest context first, and whether programs read their first
key tile before the PDL wait. Each rule follows measurements on an H100 (decisions 0015, 0018, 0020); they
read the SM count, so the CPU interpreter (no SMs) takes fixed choices that keep every path under test.
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

    Two per SM read the most bandwidth of 1 / 2 / 4 / 8 in the kernel sweep (decision 0018).
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

    Within one wave every program is resident at once and the order gains nothing (it lost a little at
    B = 64 on an H100): decision 0020.
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
    programs fit an SM instead of 4, which split grids of few programs afford and one-split grids of large
    batches do not (decision 0015). S * Hkv <= SMs keeps a split grid (about PROGRAMS_PER_SM per SM, rounded
    up by less than one S * Hkv) within 3.
    """
    if num_splits == 1:
        return False
    return device.type != "cuda" or num_seqs * num_kv_heads <= num_sms(device)
