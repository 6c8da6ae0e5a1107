"""A step's sampled tokens into pinned host memory by a kernel that writes it itself (over PCIe), where a
device-to-host copy would take the copy engine: dst[i] = src[i] for a contiguous int64 [N], N small
(the [2, S] tokens and finiteness flags of a step).

Why: at the tail of every step the copy engine's op costs more than its few bytes (decision 0021). The host
reads dst after an event recorded behind this kernel: the kernel's completion makes its writes to mapped host
memory visible to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import interpreting

BLOCK = 512


@triton.jit(do_not_specialize=["n"])  # one variant for every batch size (kernels/stage_batch.py's NOTE)
def _write_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < n
    tl.store(dst_ptr + idx, tl.load(src_ptr + idx, mask=inside), mask=inside)


def write_to_host(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst (pinned host memory) = src (on the device), both contiguous int64 of the same size."""
    if src.dtype != torch.int64 or dst.dtype != torch.int64:
        raise ValueError(f"src and dst must be int64, got {src.dtype} and {dst.dtype}")
    if src.shape != dst.shape or not src.is_contiguous() or not dst.is_contiguous():
        raise ValueError(f"src and dst must be contiguous and of one shape, got {tuple(src.shape)} and "
                         f"{tuple(dst.shape)}")  # fmt: skip
    if not interpreting() and not dst.is_pinned():
        raise ValueError("dst must be pinned host memory (the kernel writes it over PCIe)")
    if src.numel():
        _write_kernel[(triton.cdiv(src.numel(), BLOCK),)](src, dst, src.numel(), BLOCK=BLOCK, num_warps=4)
