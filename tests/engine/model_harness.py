"""A minimal paged runner for model tests: a fresh KV pool, block tables and the flat
varlen batch's AttentionMetadata, built by hand (no scheduler, no ModelRunner).

Legend: T = new tokens of the step, S = sequences, V = vocabulary, M = max blocks per sequence.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from engine.attention_metadata import AttentionMetadata

BLOCK_SIZE = 16


class PagedHarness:
    """Runs steps of a model over a private paged KV pool.

    Blocks are handed out in a shuffled order, so block tables are not contiguous and
    sequences interleave in the pool (paging bugs cannot hide behind identity tables).
    """

    def __init__(self, model: torch.nn.Module, num_blocks: int = 64, block_size: int = BLOCK_SIZE, seed: int = 0):
        param = next(model.parameters())
        self.model = model
        self.block_size = block_size
        self.device = param.device
        shape = (2, num_blocks, block_size, model.num_kv_heads, model.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=param.dtype, device=self.device) for _ in range(model.num_layers)]
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.seq_lens: dict[str, int] = {}

    def _slot(self, seq_id: str, position: int) -> int:
        table = self.block_tables.setdefault(seq_id, [])
        while len(table) <= position // self.block_size:
            table.append(self.free_blocks.pop())
        return table[position // self.block_size] * self.block_size + position % self.block_size

    @torch.no_grad()
    def step(self, new_tokens: dict[str, list[int]], last_only: bool = False) -> dict[str, torch.Tensor]:
        """Feeds each sequence's new tokens as ONE flat batch.

        Returns logits per sequence: [q_len, V], or [1, V] for its last token when last_only.
        """
        input_ids, positions, slots, query_lens, seq_lens = [], [], [], [], []
        for seq_id, tokens in new_tokens.items():
            start = self.seq_lens.get(seq_id, 0)
            for i, token in enumerate(tokens):
                input_ids.append(token)
                positions.append(start + i)
                slots.append(self._slot(seq_id, start + i))
            self.seq_lens[seq_id] = start + len(tokens)
            query_lens.append(len(tokens))
            seq_lens.append(start + len(tokens))
        max_blocks = max(len(self.block_tables[s]) for s in new_tokens)
        tables = [self.block_tables[s] + [0] * (max_blocks - len(self.block_tables[s])) for s in new_tokens]
        query_start_loc = [0]
        for q_len in query_lens:
            query_start_loc.append(query_start_loc[-1] + q_len)

        def tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=self.device),  # [S, M]
            seq_lens=tensor(seq_lens, torch.int32),
            query_start_loc=tensor(query_start_loc, torch.int32),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            seq_lens_cpu=seq_lens,
            query_lens_cpu=query_lens,
        )
        hidden = self.model(tensor(input_ids, torch.int64), tensor(positions, torch.int64), self.kv_caches, meta)
        if last_only:
            last_rows = torch.tensor(query_start_loc[1:], device=self.device) - 1
            logits = self.model.compute_logits(hidden[last_rows])  # [S, V]
            return {seq_id: logits[i : i + 1] for i, seq_id in enumerate(new_tokens)}
        logits = self.model.compute_logits(hidden)  # [T, V]
        return dict(zip(new_tokens, logits.split(query_lens), strict=True))


def greedy_generate(
    model: torch.nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_ids: set[int],
    until: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """Greedy continuation of one prompt: a prefill step, then one decode step per token.

    Stops after max_new_tokens, at a stop id (included), or once `until(output)` holds.
    """
    harness = PagedHarness(model, num_blocks=(len(prompt_ids) + max_new_tokens) // BLOCK_SIZE + 2)
    logits = harness.step({"s": prompt_ids}, last_only=True)["s"]
    output: list[int] = []
    for _ in range(max_new_tokens):
        token = int(logits[-1].argmax())
        output.append(token)
        if token in stop_ids or (until is not None and until(output)):
            break
        logits = harness.step({"s": [token]}, last_only=True)["s"]
    return output
