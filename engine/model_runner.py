"""Runs one scheduler decision through the model: builds the flat batch, calls the
model, picks the last position of each sampling request, samples.

Legend: T = tokens scheduled in the step, S = sequences, M = max blocks per sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.attention_metadata import AttentionMetadata
from engine.kv_cache import (
    DEFAULT_CPU_KV_TOKENS,
    KVCacheSpec,
    allocate_kv_cache,
    num_blocks_for_tokens,
    num_blocks_from_free_memory,
)
from engine.request import Logprob, Request
from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class ModelRunnerOutput:
    """Per sampling request (in scheduling order): its new token, logprob and error."""

    requests: list[Request]
    token_ids: list[int]
    logprobs: list[Logprob | None]
    errors: list[str | None]


class ModelRunner:
    """Owns the model, the KV pool and the sampler on one device.

    Args:
        model: a model with the interface of engine/models (forward, compute_logits,
            num_layers, num_kv_heads, head_dim).
        device: where it runs.
        dtype: the KV cache dtype (the model's).
        block_size: tokens per KV block.
        num_kv_tokens: pool size in tokens; None sizes it from free GPU memory (CUDA)
            or takes DEFAULT_CPU_KV_TOKENS (CPU).
        gpu_memory_utilization: see CacheConfig.
        max_num_batched_tokens, max_num_seqs: the largest step, for the warm-up.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int,
        num_kv_tokens: int | None,
        gpu_memory_utilization: float,
        max_num_batched_tokens: int,
        max_num_seqs: int,
    ) -> None:
        self.model = model
        self.device = device
        self.block_size = block_size
        self.sampler = Sampler()
        self.spec = KVCacheSpec(model.num_layers, model.num_kv_heads, model.head_dim, block_size, dtype)
        if num_kv_tokens is None and device.type == "cuda":
            self._warm_up(max_num_batched_tokens, max_num_seqs)
            self.num_blocks = num_blocks_from_free_memory(self.spec, device, gpu_memory_utilization)
        else:
            self.num_blocks = num_blocks_for_tokens(num_kv_tokens or DEFAULT_CPU_KV_TOKENS, block_size)
        self.kv_cache = allocate_kv_cache(self.spec, self.num_blocks, device)
        self.kv_caches = list(self.kv_cache.unbind(0))  # per layer [2, N, B, Hkv, D]

    # ---- warm-up --------------------------------------------------------
    @torch.inference_mode()
    def _warm_up(self, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        """One forward at the largest step, over a throwaway pool, so the peak is known."""
        num_tokens = max_num_batched_tokens
        num_blocks = num_blocks_for_tokens(num_tokens, self.block_size) + 1
        scratch = allocate_kv_cache(self.spec, num_blocks, self.device)
        caches = list(scratch.unbind(0))
        num_seqs = min(max_num_seqs, num_tokens)
        lens = [num_tokens // num_seqs] * num_seqs
        lens[-1] += num_tokens - sum(lens)
        meta, positions = self._prefill_metadata(lens)
        input_ids = torch.randint(0, 100, (num_tokens,), device=self.device)
        hidden = self.model(input_ids, positions, caches, meta)
        last = meta.query_start_loc[1:].long() - 1
        logits = self.model.compute_logits(hidden[last])
        torch.softmax(logits, dim=-1).sort(dim=-1)
        del scratch, caches, hidden, logits
        torch.cuda.synchronize(self.device)

    def _prefill_metadata(self, lens: list[int]) -> tuple[AttentionMetadata, torch.Tensor]:
        """Metadata for fresh sequences laid out one after another in the pool (warm-up only)."""
        slots, tables, positions = [], [], []
        next_block = 0
        max_blocks = max(num_blocks_for_tokens(n + self.block_size - 1, self.block_size) for n in lens)
        for n in lens:
            blocks = list(range(next_block, next_block + -(-n // self.block_size)))
            next_block += len(blocks)
            tables.append(blocks + [0] * (max_blocks - len(blocks)))
            slots.extend(blocks[p // self.block_size] * self.block_size + p % self.block_size for p in range(n))
            positions.extend(range(n))
        return self._metadata(slots, tables, lens, lens), torch.tensor(positions, device=self.device)

    # ---- one step -------------------------------------------------------
    def _metadata(
        self, slots: list[int], tables: list[list[int]], seq_lens: list[int], query_lens: list[int]
    ) -> AttentionMetadata:
        device = self.device
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            seq_lens_cpu=seq_lens,
            query_lens_cpu=query_lens,
        )

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Runs the step's forward pass and samples for requests that reach their end."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_lens: list[int] = []
        logits_rows: list[int] = []
        sampling: list[Request] = []
        max_blocks = max(len(s.block_ids) for s in sched.scheduled)
        tables: list[list[int]] = []
        bs = self.block_size
        for item in sched.scheduled:
            start, end = item.num_computed_tokens, item.num_computed_tokens + item.num_new_tokens
            input_ids.extend(item.request.all_token_ids[start:end])
            positions.extend(range(start, end))
            blocks = item.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            tables.append(blocks + [0] * (max_blocks - len(blocks)))
            seq_lens.append(end)
            query_lens.append(item.num_new_tokens)
            if item.samples:
                logits_rows.append(len(input_ids) - 1)
                sampling.append(item.request)

        meta = self._metadata(slots, tables, seq_lens, query_lens)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        hidden = self.model(ids, pos, self.kv_caches, meta)  # [T, H]
        if not sampling:
            return ModelRunnerOutput([], [], [], [])
        rows = torch.tensor(logits_rows, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden[rows])  # [S, V] float32
        out = self.sampler(logits, sampling)
        return ModelRunnerOutput(sampling, out.token_ids, out.logprobs, out.errors)
