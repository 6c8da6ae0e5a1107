"""Token bitmask: tokens a grammar forbids get -inf logits, for the rows that carry a constraint, in one kernel.

Legend: S = rows of the step's logits, V = vocabulary, W = ceil(V / 32) mask words, R = constrained rows.
logits [S, V] float (last dim contiguous), bitmask [S, W] int32 (bit v % 32 of word v // 32 set: token v
allowed; the layout xgrammar's fill_next_token_bitmask writes), rows [R] int32: the rows to mask. Rows not
listed are not read or written, so a batch that mixes constrained and free requests pays only for the
constrained ones. Bits past the mask's width (a vocabulary wider than the tokenizer's) count as 0: those
ids are no token the grammar could accept.

Kernel: grid (R, ceil(V / BLOCK_V)); program (r, c) loads BLOCK_V / 32 words of row rows[r] and stores -inf
over the tokens whose bit is 0 in its BLOCK_V-wide chunk. In place, fixed shapes, no host read: safe to run
inside a captured graph when the buffers are the graph's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_device, check_float

BLOCK_V = 1024


@triton.jit(do_not_specialize=["vocab", "num_words"])
def _bitmask_kernel(
    logits_ptr,  # [S, V]
    bitmask_ptr,  # [S, W] int32
    rows_ptr,  # [R] int32
    logits_stride,
    bitmask_stride,
    vocab,
    num_words,
    BLOCK_V: tl.constexpr,
):
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    words = cols // 32
    word = tl.load(bitmask_ptr + row * bitmask_stride + words, mask=(cols < vocab) & (words < num_words), other=0)
    allowed = ((word >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * logits_stride + cols, float("-inf"), mask=(cols < vocab) & ~allowed)


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    check_float("logits", logits)
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be [S, V] with a contiguous last dim, got shape {tuple(logits.shape)}")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.stride(-1) != 1:
        raise ValueError(f"bitmask must be [S, W] int32 with a contiguous last dim, got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")  # fmt: skip
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask must have one row per logits row ({logits.shape[0]}), got {bitmask.shape[0]}")
    if rows.dtype != torch.int32 or rows.dim() != 1:
        raise ValueError(f"rows must be a 1-dim int32 tensor, got {rows.dtype} {tuple(rows.shape)}")


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Sets logits[r, v] = -inf for each r in rows where bit v of bitmask[r] is 0; in place, returns logits."""
    _check(logits, bitmask, rows)
    check_device(_bitmask_kernel, "logits, bitmask and rows", logits, bitmask, rows)
    if rows.numel() == 0:
        return logits
    grid = (rows.numel(), triton.cdiv(logits.shape[1], BLOCK_V))
    _bitmask_kernel[grid](logits, bitmask, rows, logits.stride(0), bitmask.stride(0), logits.shape[1],
                          bitmask.shape[1], BLOCK_V=BLOCK_V)  # fmt: skip
    return logits


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """apply_token_bitmask in torch."""
    _check(logits, bitmask, rows)
    if rows.numel() == 0:
        return logits
    vocab = logits.shape[1]
    index = rows.long()
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask[index].unsqueeze(-1) >> shifts) & 1).flatten(1)  # [R, 32 W], bit v of the row at column v
    if bits.shape[1] < vocab:  # a mask narrower than the logits: the ids past it are not allowed
        bits = torch.nn.functional.pad(bits, (0, vocab - bits.shape[1]))
    allowed = bits[:, :vocab].bool()
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits
