"""The static paged KV pool: sized once at start, allocated once, never per request.

Layout: one tensor [L, 2, N, B, Hkv, D] (L layers, keys then values, N blocks of
B tokens); layer i uses the view kv[i] of shape [2, N, B, Hkv, D].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# CPU has no "free memory" to measure against; this many tokens is the default pool.
DEFAULT_CPU_KV_TOKENS = 8192


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * itemsize


def num_blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    return max(1, num_tokens // block_size)


def num_blocks_from_free_memory(spec: KVCacheSpec, device: torch.device, utilization: float) -> int:
    """Blocks that fit in `utilization` of the GPU after the warm-up's peak usage.

    Call after a forward pass at the largest batch, so activations are accounted for.
    """
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_reserved(device)
    budget = total * utilization - used_by_others - peak
    num_blocks = int(budget // spec.bytes_per_block)
    if num_blocks < 1:
        raise RuntimeError(
            f"no room for the KV cache: {budget / 2**30:.2f} GiB left of gpu_memory_utilization={utilization} "
            f"after weights and warm-up (peak {peak / 2**30:.2f} GiB); raise gpu_memory_utilization "
            "or lower max_num_batched_tokens"
        )
    return num_blocks


# torch's small pool (blocks under 1 MiB) takes 2 MiB segments: this many are kept cached at start, since
# serving still mapped a few after the large room was reserved (decision 0010).
SMALL_POOL_SEGMENTS = 8
_SMALL_BLOCK = 2**20 - 512  # two fill a small segment


def reserve_activation_room(device: torch.device, budget_bytes: int) -> None:
    """Brings torch's reserved memory up to `budget_bytes` (the warm-up's peak plus the pool: what the pool's
    sizing left for the process): SMALL_POOL_SEGMENTS small segments, then one block of the rest, freed at
    once and kept in torch's cache on the current stream, so that the activations of served steps are cut
    from them, not mapped inside the steps.

    Why: capturing a CUDA graph empties torch's cache (torch.cuda.graph calls empty_cache), which gave the
    warm-up forward's activation blocks back to the driver; the first served prefill steps then mapped new
    device segments inside the steps (decision 0010). The reserved total stays what the sizing allowed: the
    graphs' pool is inside torch's reserved memory, so it comes out of this room.
    """
    small = [torch.empty(_SMALL_BLOCK, dtype=torch.uint8, device=device) for _ in range(2 * SMALL_POOL_SEGMENTS)]
    del small  # cached, as below
    room = budget_bytes - torch.cuda.memory_reserved(device)
    if room < 2**20:
        return
    block = torch.empty(room, dtype=torch.uint8, device=device)
    del block  # back to torch's cache, not to the driver
    logger.info("activation room: %.2f GiB cached for the steps", room / 2**30)


def allocate_kv_cache(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> torch.Tensor:
    """Allocates the pool once and logs its size."""
    shape = (spec.num_layers, 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    kv = torch.zeros(shape, dtype=spec.dtype, device=device)
    tokens = num_blocks * spec.block_size
    gib = num_blocks * spec.bytes_per_block / 2**30
    logger.info("KV cache: %d blocks x %d tokens = %d tokens, %.2f GiB", num_blocks, spec.block_size, tokens, gib)
    return kv
