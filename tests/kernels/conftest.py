"""Kernel tests run for real on CUDA and through Triton's CPU interpreter elsewhere.

NOTE: TRITON_INTERPRET must be set before anything imports triton (see
kernels/interpreter.py). pytest imports this file before the test modules of this
folder, which is enough when tests/kernels runs alone; when the whole tests/ tree
runs, modules of other folders (anything importing engine.ops) are imported
earlier, so the top-level tests/conftest.py must set it first. If it did not, this
file stops the session with that instruction rather than run broken kernels.
"""

from __future__ import annotations

import pytest
import torch

from kernels.interpreter import use_cpu_interpreter

ON_GPU = torch.cuda.is_available()

if not ON_GPU:
    try:
        use_cpu_interpreter()
    except RuntimeError as e:
        raise pytest.UsageError(f"{e}; do it at the top of tests/conftest.py") from e


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture
def poison_allocator():
    """poison(shape, dtype, device): fills freed memory with NaN so that an output the
    kernel forgets to write reads as NaN.

    The CUDA caching allocator hands the freed block to the next allocation of that
    size; on the CPU it is best effort (small blocks are usually reused). Either way
    every output element is compared with the reference, computed after the kernel.
    """

    def poison(shape, dtype: torch.dtype, device: torch.device) -> None:
        junk = torch.full(shape, float("nan"), dtype=dtype, device=device)
        del junk

    return poison


class PagedBatch:
    """A batch of sequences whose K/V sit in a paged pool with shuffled, non-contiguous block ids.

    Legend: T = new tokens, S = sequences, N = blocks, B = block size.
    Slots of the pool that no sequence owns, and the tail of each sequence's last
    block, hold NaN: a kernel that reads past seq_lens or through a wrong block id
    turns its output into NaN.
    """

    def __init__(self, query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device):
        seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + 3  # spare blocks, never referenced
        order = torch.randperm(num_blocks)
        width = max(max(blocks_per_seq), 1) + 1  # a padded column, as the engine's tables have
        self.block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
        slots = []  # flat slot of every token of every sequence
        used = 0
        for s, (n_blocks, n_tokens) in enumerate(zip(blocks_per_seq, seq_lens)):
            self.block_tables[s, :n_blocks] = order[used : used + n_blocks]
            used += n_blocks
            pos = torch.arange(n_tokens)
            slots.append(self.block_tables[s, pos // block_size].long() * block_size + pos % block_size)
        slots = torch.cat(slots).to(device)
        # kv_cache: [2, N, B, Hkv, D], the engine's per-layer layout
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        flat = self.kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
        flat[:, slots] = torch.randn(2, slots.numel(), num_kv_heads, head_dim, device=device).to(dtype)
        self.block_tables = self.block_tables.to(device)
        self.q = torch.randn(sum(query_lens), num_heads, head_dim, device=device).to(dtype)  # [T, Hq, D]
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32, device=device)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        self.seq_lens_cpu = seq_lens
        self.query_lens_cpu = list(query_lens)

    @property
    def k_cache(self) -> torch.Tensor:
        return self.kv_cache[0]

    @property
    def v_cache(self) -> torch.Tensor:
        return self.kv_cache[1]


@pytest.fixture
def paged_batch(device):
    """paged_batch(query_lens, context_lens, Hq, Hkv, D, block_size, dtype) -> PagedBatch on the test device."""

    def make(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype) -> PagedBatch:
        return PagedBatch(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device)

    return make
