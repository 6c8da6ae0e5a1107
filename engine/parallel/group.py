"""The tensor-parallel group a model is built for: this process's rank, the group's size, and the two
collectives its layers call.

Legend: N = ranks, Hq/Hkv = query/KV heads.

A model is built inside `building_for(tp)`; each layer reads `current()` while it is built, sizes its
parameters to this rank's shard and keeps the group for its forward pass (a row-parallel projection sums its
partial outputs over the group). Outside `building_for` the group is `SINGLE`: one rank, no collective, the
layers exactly as without tensor parallelism.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

RANK_WATCH_INTERVAL_S = 0.5  # how often rank 0 looks for a rank that exited (engine/parallel/launch.py)


class RankGroupBroken(BaseException):
    """The ranks of a tensor-parallel group are out of step (a rank failed inside a step the others run, or a
    rank died): no further step can be served. A BaseException, so that the engine's per-request failure
    handling, which catches Exception, does not retry on a group that can no longer answer: the worker exits
    and another resumes its requests."""


def group_broken(message: str) -> RankGroupBroken:
    """The error to raise after a collective failed. A rank that died fails gloo's collectives at once: this
    first gives rank 0's watch (engine/parallel/launch.py) the time to name the rank and end the process with
    its exit code; a failure with every rank alive comes back as the group's end."""
    time.sleep(3 * RANK_WATCH_INTERVAL_S)
    return RankGroupBroken(message)


@dataclass(frozen=True)
class AttentionHeads:
    """This rank's attention heads: `q` query heads from query head `q_start`, `kv` KV heads from `kv_start`."""

    q: int
    kv: int
    q_start: int
    kv_start: int


@dataclass(frozen=True)
class TensorParallel:
    """One rank of a tensor-parallel group.

    Args:
        rank: this process's rank, 0..size-1 (rank 0 owns the scheduler and samples).
        size: N.
        group: the torch.distributed process group; None for one rank.
    """

    rank: int = 0
    size: int = 1
    group: Any = None

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def split(self, total: int, what: str) -> tuple[int, int]:
        """(first index, count) of this rank's equal share of `total` items.

        Raises:
            ValueError: `total` does not divide into N equal shares (`what` names it).
        """
        if total % self.size:
            raise ValueError(f"{what} ({total}) must be divisible by tensor_parallel_size ({self.size})")
        share = total // self.size
        return self.rank * share, share

    def heads(self, num_heads: int, num_kv_heads: int) -> AttentionHeads:
        """Query heads split evenly; KV heads split evenly, or, with fewer KV heads than ranks, one KV head per
        rank, replicated on the N / Hkv ranks whose query heads share it.

        Raises:
            ValueError: heads that do not divide over the ranks.
        """
        q_start, q = self.split(num_heads, "num_attention_heads")
        if num_kv_heads >= self.size:
            kv_start, kv = self.split(num_kv_heads, "num_key_value_heads")
        elif self.size % num_kv_heads == 0:
            kv_start, kv = self.rank * num_kv_heads // self.size, 1
        else:
            raise ValueError(
                f"num_key_value_heads ({num_kv_heads}) must divide tensor_parallel_size ({self.size}) "
                "or be divisible by it"
            )
        return AttentionHeads(q, kv, q_start, kv_start)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums x over the group, in place (a captured CUDA graph replays the NCCL call); x on one rank."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value` (each rank's KV pool must hold the same blocks)."""
        if self.size == 1:
            return value
        device = "cuda" if dist.get_backend(self.group) == "nccl" else "cpu"
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


SINGLE = TensorParallel()
_BUILDING: ContextVar[TensorParallel] = ContextVar("inferq_tensor_parallel", default=SINGLE)


@contextlib.contextmanager
def building_for(tp: TensorParallel) -> Iterator[None]:
    """Layers built inside take `tp`'s shard of their parameters."""
    token = _BUILDING.set(tp)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def current() -> TensorParallel:
    """The group the model being built is for (SINGLE outside building_for)."""
    return _BUILDING.get()
