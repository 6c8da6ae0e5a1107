"""The flat batch's attention description: the one object the model's attention
layers receive besides activations and their own slice of the KV pool.

Legend: T = new tokens in the step (all sequences, flattened), S = sequences,
M = max blocks per sequence in this batch.

KV pool layout, per layer: kv_cache[L] has shape [2, num_blocks, block_size, Hkv, D];
kv_cache[L][0] holds keys and kv_cache[L][1] values. Token `p` of a sequence lives
in block `block_tables[s, p // block_size]` at offset `p % block_size`; its flat
slot is block_id * block_size + offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes and what each query attends to.

    Args:
        slot_mapping: [T] int64, flat KV slot of each new token (-1: do not store).
        block_tables: [S, M] int32, block ids of each sequence, padded with 0.
        seq_lens: [S] int32, context length of each sequence after this step
            (cached tokens + new tokens); query i of sequence s sits at position
            seq_lens[s] - query_len[s] + i and attends to positions 0..that one.
        query_start_loc: [S+1] int32, cumulative new-token counts (cu_seqlens_q).
        max_query_len: largest number of new tokens of one sequence.
        max_seq_len: largest seq_lens entry.
        seq_lens_cpu, query_lens_cpu: host copies (the torch reference loops over them).
        decode_order: [S] the sequences longest context first, for the decode kernel's grid, or None
            (set by the model runner before each forward: engine.attention_ops.decode_order).
        num_fresh_keys: a decode step's newest positions per sequence that its own KV store may write: 1, or
            1 + k in an engine whose verification steps run as decode rows (engine/verify_rows.py).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    seq_lens_cpu: list[int]
    query_lens_cpu: list[int]
    decode_order: torch.Tensor | None = None
    num_fresh_keys: int = 1

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        """Every sequence brings exactly one new token (the decode kernel's case)."""
        return self.max_query_len == 1
