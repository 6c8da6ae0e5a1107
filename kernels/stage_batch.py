"""Staging a step's batch on the device with one kernel that reads the host's pinned buffers itself.

The engine stages a step's flat metadata in pinned host memory (engine/input_batch.py): an int64
buffer (input ids, positions, slots, logits rows) and an int32 one (sequence lengths, query start
offsets, then the block-table rows that changed). This kernel reads them over PCIe (pinned memory is
mapped into the device's address space) and writes:

    dev64[:n64] = host64[:n64], except input ids (i < num_ids) staged negative: -1 - r means "the token
                  the last step sampled in row r", read from pending[r] (async scheduling: the host
                  has not read that token yet)
    dev32[:n32] = host32[:n32]
    tables[r, c] = host32[n32 + r * width + c] for r < num_rows, c < width

Why a kernel and not copies: two host-to-device copies, the pending tokens' gather and the block
table's strided copy were four stream ops on two engines (the copy engine, then the SMs) at the head
of every step. With the queue full, such copy-engine ops cost more beyond their own work than
kernels that read and write pinned memory themselves (decision 0021).

NOTE: launch it without PDL, and let a kernel launched without PDL come after it (the embedding):
kernels launched with PDL read the step's metadata before their griddepcontrol.wait
(kernels/_pdl.py), which only a completed predecessor makes safe.

Kernel: a 1-D grid; each of the three ranges has programs of its own (up to MAX_PROGRAMS_A_RANGE,
striding over it in BLOCK-element chunks), so their PCIe round trips overlap: at batch 1 the int64 and
int32 heads are read side by side instead of one after the other in one program.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._launch import interpreting

BLOCK = 1024
MAX_PROGRAMS_A_RANGE = 16


@dataclass(frozen=True)
class StagingBuffers:
    """The buffers a step is staged through, allocated once (engine/input_batch.py).

    host64, host32: int64 / int32 staging in pinned host memory (any CPU memory under the interpreter
        and for the reference). dev64, dev32: their device mirrors. tables: int32 [Smax, W] block table
        on the device.
    """

    host64: torch.Tensor
    dev64: torch.Tensor
    host32: torch.Tensor
    dev32: torch.Tensor
    tables: torch.Tensor

    def __post_init__(self) -> None:
        """Checked once, where they are made: a step's launch checks only its sizes."""
        named = (("host64", self.host64, torch.int64), ("dev64", self.dev64, torch.int64),
                 ("host32", self.host32, torch.int32), ("dev32", self.dev32, torch.int32))  # fmt: skip
        for name, t, dtype in named + (("tables", self.tables, torch.int32),):
            if t.dtype != dtype:
                raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
        for name, t, _ in named:
            if t.dim() != 1 or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous 1-D tensor, got shape {tuple(t.shape)}")
        if self.tables.dim() != 2 or self.tables.stride(1) != 1:
            raise ValueError(f"tables must be [rows, width], unit column stride, got strides {self.tables.stride()}")
        if self.dev64.is_cuda and not interpreting() and not (self.host64.is_pinned() and self.host32.is_pinned()):
            raise ValueError("host64 and host32 must be pinned host memory (the kernel reads them over PCIe)")


# NOTE: the sizes change from step to step; left to Triton, each new class of them (1, a multiple of 16,
# anything else, per argument) would compile another variant in the middle of serving. One variant serves all.
_SIZES = ["n64", "num_ids", "n32", "table_stride", "num_rows", "width", "programs64", "programs32"]


@triton.jit(do_not_specialize=_SIZES)
def _stage_kernel(
    host64_ptr,  # int64 pinned host memory
    dev64_ptr,
    n64,
    num_ids,  # dev64[:num_ids] are input ids
    pending_ptr,  # int64 [P]: the last step's sampled tokens (any valid pointer when none is pending)
    host32_ptr,  # int32 pinned host memory: [n32 head | num_rows x width table rows]
    dev32_ptr,
    n32,
    tables_ptr,  # int32 [Smax, W] on the device
    table_stride,
    num_rows,
    width,
    programs64,  # programs [0, programs64) take the int64 range
    programs32,  # the next programs32 the int32 head; the rest the table rows
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    if pid < programs64:
        for start in range(pid * BLOCK, n64, programs64 * BLOCK):
            idx = start + lanes
            inside = idx < n64
            value = tl.load(host64_ptr + idx, mask=inside, other=0)
            waits = inside & (idx < num_ids) & (value < 0)
            token = tl.load(pending_ptr + (-1 - value), mask=waits, other=0)
            tl.store(dev64_ptr + idx, tl.where(waits, token, value), mask=inside)
    elif pid < programs64 + programs32:
        for start in range((pid - programs64) * BLOCK, n32, programs32 * BLOCK):
            idx = start + lanes
            inside = idx < n32
            tl.store(dev32_ptr + idx, tl.load(host32_ptr + idx, mask=inside), mask=inside)
    else:
        first = programs64 + programs32
        for start in range((pid - first) * BLOCK, num_rows * width, (tl.num_programs(0) - first) * BLOCK):
            idx = start + lanes
            inside = idx < num_rows * width
            row = idx // width
            column = idx - row * width
            value = tl.load(host32_ptr + n32 + idx, mask=inside)
            tl.store(tables_ptr + row.to(tl.int64) * table_stride + column, value, mask=inside)


def _programs(elements: int) -> int:
    """Programs for one of the three ranges: each reads its chunks over PCIe one round trip after another,
    so the ranges get programs of their own and run side by side."""
    return min(MAX_PROGRAMS_A_RANGE, triton.cdiv(elements, BLOCK))


def stage_batch(
    buffers: StagingBuffers, n64: int, num_ids: int, pending: torch.Tensor | None, n32: int, num_rows: int, width: int
) -> None:
    """Stages a step (see the module docstring): n64 / n32 staged int64 / int32 values, of which the
    first num_ids are input ids, and num_rows x width table rows after the int32 head; pending: the
    last step's sampled tokens [P] on the device, or None when no input id is staged negative."""
    b = buffers
    if pending is not None and (pending.dtype != torch.int64 or pending.dim() != 1 or pending.stride(0) != 1):
        raise ValueError(f"pending must be a contiguous 1-D int64 tensor, got {pending.dtype} {tuple(pending.shape)}")
    if n64 > b.host64.numel() or n64 > b.dev64.numel() or num_ids > n64:
        raise ValueError(f"n64 {n64} / num_ids {num_ids} exceed the buffers ({b.host64.numel()}, {b.dev64.numel()})")
    if n32 + num_rows * width > b.host32.numel() or n32 > b.dev32.numel():
        raise ValueError(f"n32 {n32} + {num_rows} x {width} table entries exceed the buffers "
                         f"({b.host32.numel()}, {b.dev32.numel()})")  # fmt: skip
    if num_rows > b.tables.shape[0] or width > b.tables.shape[1]:
        raise ValueError(f"{num_rows} x {width} table rows exceed tables {tuple(b.tables.shape)}")
    programs64, programs32, programs_tables = _programs(n64), _programs(n32), _programs(num_rows * width)
    if programs64 + programs32 + programs_tables == 0:
        return
    _stage_kernel[(programs64 + programs32 + programs_tables,)](
        b.host64, b.dev64, n64, num_ids, pending if pending is not None else b.dev64,
        b.host32, b.dev32, n32, b.tables, b.tables.stride(0), num_rows, width, programs64, programs32,
        BLOCK=BLOCK, num_warps=4,
    )  # fmt: skip


def stage_batch_ref(
    buffers: StagingBuffers, n64: int, num_ids: int, pending: torch.Tensor | None, n32: int, num_rows: int, width: int
) -> None:
    """stage_batch in torch (CPU engine and tests): copies, then the pending ids' gather.

    NOTE: on CUDA the boolean mask would wait for the device; the engine takes the kernel there."""
    b = buffers
    b.dev64[:n64].copy_(b.host64[:n64])
    ids = b.dev64[:num_ids]
    waits = ids < 0
    if pending is not None and bool(waits.any()):
        ids[waits] = pending[-1 - ids[waits]]
    b.dev32[:n32].copy_(b.host32[:n32])
    if num_rows and width:
        b.tables[:num_rows, :width].copy_(b.host32[n32 : n32 + num_rows * width].view(num_rows, width))
