"""A step's items into the host staging's int64 and int32 heads (engine/input_batch.py lays the fields out):
input ids, positions, KV slots, sequence lengths and query offsets, for a decode step (one token an item) or any
mixed step. InputBatch owns one StepFill over its pinned buffers and calls it once a step, before the staging
kernel brings the heads to the device."""

from __future__ import annotations

import numpy as np

from engine.request import Request
from engine.scheduler import ScheduledRequest


def align(n: int) -> int:
    """n rounded up to a multiple of 16 elements (16-byte aligned fields for Triton)."""
    return (n + 15) // 16 * 16


class StepFill:
    """Args:
    np64, np32: the host staging's int64 and int32 buffers (numpy views of the pinned tensors).
    host_tables: the host block table's rows [Smax, W] (engine/block_table_rows.py), updated for the step.
    arange: 0, 1, 2, ... at least as long as the longest sequence and the largest step.
    block_size: tokens per KV block.
    """

    def __init__(
        self, np64: np.ndarray, np32: np.ndarray, host_tables: np.ndarray, arange: np.ndarray, block_size: int
    ) -> None:
        self.np64, self.np32 = np64, np32
        self.host_tables = host_tables
        self.arange = arange
        self.block_size = block_size

    def decode(
        self,
        scheduled: list[ScheduledRequest],
        padded: int,
        waiting: list[tuple[int, Request]],
        token_ids: list[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        """One token per item: ids, positions, slots, seq_lens, query_start_loc, padded to `padded`
        rows; returns (seq_lens, query_lens) and appends pending tokens to `waiting`.

        token_ids: the rows' input ids where the caller gives them (a verification step's decode rows,
        engine/verify_rows.py: a proposed token is in no request's tokens); None reads each item's request."""
        bs = self.block_size
        positions = [item.num_computed_tokens for item in scheduled]
        n = len(positions)
        a, sa = align(padded), align(padded + 1)
        np64, np32 = self.np64, self.np32
        ids = token_ids if token_ids is not None else []
        for i, (item, p) in enumerate(zip(scheduled, positions) if token_ids is None else ()):
            tokens = item.request.all_token_ids
            if p < len(tokens):
                ids.append(tokens[p])
            else:
                ids.append(0)
                waiting.append((i, item.request))
        np64[:n] = ids
        np64[a : a + n] = positions
        np64[2 * a : 2 * a + n] = [item.block_ids[p // bs] * bs + p % bs for item, p in zip(scheduled, positions)]
        seq_lens = [p + 1 for p in positions]
        np32[:n] = seq_lens
        if padded > n:
            np64[n:padded] = 0
            np64[a + n : a + padded] = 0
            np64[2 * a + n : 2 * a + padded] = -1
            np32[n:padded] = 0
        np32[sa : sa + padded + 1] = self.arange[: padded + 1]
        return seq_lens, [1] * n

    def mixed(
        self,
        scheduled: list[ScheduledRequest],
        num_tokens: int,
        padded: tuple[int, int],
        waiting: list[tuple[int, Request]],
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """Any mix of prefill chunks and decodes, padded to `padded` (tokens, sequences); returns
        (seq_lens, query_lens, logits rows, sampling items) and appends pending tokens to `waiting`.

        NOTE: the loop gathers Python lists only; positions, slots and offsets are then computed for all
        tokens at once. A mixed step at a full batch is mostly decodes (a batch's new lines join running
        ones at every step), and per-item numpy work made this the engine's largest host cost there."""
        bs = self.block_size
        np64, np32 = self.np64, self.np32
        num_seqs = len(scheduled)
        pad_tokens, pad_seqs = padded
        a, sa = align(pad_tokens), align(pad_seqs + 1)
        t = 0
        ids: list[int] = []
        seq_lens, query_lens, rows, sampling = [], [], [], []
        for i, item in enumerate(scheduled):
            start, n = item.num_computed_tokens, item.num_new_tokens
            end = start + n
            tokens = item.request.all_token_ids
            proposed = item.proposed_token_ids
            if proposed:  # speculative decoding: the request's last tokens, then the proposal (none is pending)
                ids += tokens[start:]
                ids += proposed
            elif end <= len(tokens):
                if n == 1:
                    ids.append(tokens[start])
                else:
                    ids += tokens[start:end]
            else:  # only the newest token can be pending
                ids += tokens[start : end - 1]
                ids.append(0)
                waiting.append((t + n - 1, item.request))
            t += n
            seq_lens.append(end)
            query_lens.append(n)
            if proposed:  # every proposed position is verified: k + 1 sampling rows
                rows.extend(range(t - len(proposed) - 1, t))
                sampling.extend([i] * (len(proposed) + 1))
            elif item.samples:
                rows.append(t - 1)
                sampling.append(i)
        np64[:t] = ids
        lens = np.array(query_lens, dtype=np.int64)
        ends = np.cumsum(lens)
        # token j of item i sits at position start_i + (j - first token of i) = j + (end_i - ends_i)
        pos = self.arange[:t] + np.repeat(np.array(seq_lens, dtype=np.int64) - ends, lens)
        np64[a : a + t] = pos
        np64[2 * a : 2 * a + t] = self.host_tables[np.repeat(self.arange[:num_seqs], lens), pos // bs] * bs + pos % bs
        np32[:num_seqs] = seq_lens
        np32[sa] = 0
        np32[sa + 1 : sa + 1 + num_seqs] = ends
        if pad_tokens > t:
            np64[t:pad_tokens] = 0
            np64[a + t : a + pad_tokens] = 0
            np64[2 * a + t : 2 * a + pad_tokens] = -1
        if pad_seqs > num_seqs:
            np32[num_seqs:pad_seqs] = 0
            np32[sa + num_seqs + 1 : sa + pad_seqs + 1] = t
        return seq_lens, query_lens, rows, sampling
