"""One step's flat batch, staged in pinned host buffers allocated once and copied to the
device with two non-blocking copies: no torch.tensor() from Python lists per step.

Legend: T = tokens of the step (after padding), S = sequences (after padding), R = rows
that sample, M = block-table columns in use this step, W = block-table width (most
blocks one sequence can hold), Smax = most sequences in a step.

Two packed buffers, host staging (pinned on CUDA) and device mirror, same offsets, each
field starting at a multiple of a = align(T) or b = align(S + 1) elements (align rounds up to
16, so every pointer a kernel gets is 16-byte aligned and Triton compiles one variant):

    i64: [input_ids T | pad | positions T at a | pad | slot_mapping T at 2a | pad | logits_rows R at 3a
          | pad | pending sources P at 3a + r | their destinations P after them, unless they are 0..P-1]
    i32: [seq_lens S | pad | query_start_loc S+1 at b | pad | block-table rows S x M at 2b]

The offsets depend only on (T, S), so a CUDA graph captured for a decode batch of S = T = b
rows reads its inputs at the offsets every padded decode step of b rows writes (see
`decode_views`), and one captured for a mixed step padded to (T_b, S_b) at the offsets every
step padded to that bucket writes (`mixed_views`). The block table the kernels read is a separate device tensor
[Smax, W]: its width is fixed so one captured graph reads any step's table. Each step copies
only the M used columns of its rows into it, from the packed staging (a small device-side
strided copy), and only when a row changed.

Host-side, the block table is kept per row and updated incrementally: a row that holds the
same request as last step only appends its new blocks.

Pending tokens (async scheduling): a request's newest token may have been sampled by the
step launched just before this one without the host having read it. Its input id is staged
as 0 and, after the copies, one gather on the device writes it from that step's sampled
tokens (`pending`): P = such tokens, their indices in input_ids and their rows there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention_metadata import AttentionMetadata
from engine.launched_step import SampledTokens
from engine.request import Request
from engine.scheduler import ScheduledRequest


def _inputs_are_a_prefix(waiting: list[tuple[int, Request]]) -> bool:
    """Whether the pending tokens' input indices are 0..P-1: both fills append them in input order
    (strictly rising), so the last one tells."""
    return waiting[-1][0] == len(waiting) - 1


def _align(n: int) -> int:
    """n rounded up to a multiple of 16 elements (16-byte aligned fields for Triton)."""
    return (n + 15) // 16 * 16


@dataclass
class StepInputs:
    """A prepared step: device views of the packed buffers, valid until the next `prepare`.

    Args:
        input_ids, positions: [T] int64.
        meta: the attention metadata (slot_mapping [T], block_tables [S, W], seq_lens [S], ...).
        num_seqs: real sequences (S before padding).
        num_padded: rows after padding (S, equal to T for a padded decode step).
        logits_rows: [R] int64 rows of the hidden states to sample from; None when they are
            simply rows 0..num_seqs-1 (a decode step).
        sampling: ScheduledRequest index of each sampling row, in order.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    num_seqs: int
    num_padded: int
    logits_rows: torch.Tensor | None
    sampling: list[int]


class InputBatch:
    """Pinned staging + device buffers for every step of one ModelRunner.

    Args:
        max_num_tokens: most tokens in one step (max_num_batched_tokens, or a larger decode bucket).
        max_num_seqs: most sequences in one step.
        max_blocks_per_seq: W, the block-table width (ceil(max_model_len / block_size)).
        block_size: tokens per KV block.
        device: where the model runs; host buffers are pinned when it is CUDA.
    """

    def __init__(
        self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int, block_size: int, device: torch.device
    ) -> None:
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.device = device
        pin = device.type == "cuda"
        n64 = 3 * _align(max_num_tokens) + 3 * _align(max_num_seqs)
        n32 = 2 * _align(max_num_seqs + 1) + max_num_seqs * max_blocks_per_seq
        self._host64 = torch.zeros(n64, dtype=torch.int64, pin_memory=pin)
        self._host32 = torch.zeros(n32, dtype=torch.int32, pin_memory=pin)
        self._np64 = self._host64.numpy()
        self._np32 = self._host32.numpy()
        self._dev64 = torch.zeros(n64, dtype=torch.int64, device=device)
        self._dev32 = torch.zeros(n32, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((max_num_seqs, max_blocks_per_seq), dtype=torch.int32, device=device)
        self._host_tables = np.zeros((max_num_seqs, max_blocks_per_seq), dtype=np.int32)
        # NOTE: a row is reused as-is when it holds the same block list object as last step:
        # the block manager's lists only grow while their request holds its blocks (a freed
        # request's list is dropped and a new one made on reallocation). Holding the reference
        # keeps its id from being reused.
        self._row_blocks: list[list[int] | None] = [None] * max_num_seqs
        self._row_len = [0] * max_num_seqs
        self._arange = np.arange(max(max_num_tokens, max_blocks_per_seq * block_size) + 1, dtype=np.int64)
        self._copied = torch.cuda.Event() if pin else None
        # Pending-token gathers by kind (tests): where the pending inputs are 0..P-1, as in a decode step
        # whose every row waits on the last step, one index_select writes them; elsewhere a gather and a
        # scatter. Each op outside the graph adds a kernel and its launch gap to a batch-1 decode step.
        self.num_prefix_gathers = 0
        self.num_scattered_gathers = 0

    # ---- the views a captured graph reads ---------------------------------------
    def decode_views(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, meta) of a decode step of `num_rows` rows: the static inputs of its graph."""
        b, a, sa = num_rows, _align(num_rows), _align(num_rows + 1)
        meta = AttentionMetadata(
            slot_mapping=self._dev64[2 * a : 2 * a + b],
            block_tables=self.block_tables[:b],
            seq_lens=self._dev32[:b],
            query_start_loc=self._dev32[sa : sa + b + 1],
            max_query_len=1,
            max_seq_len=self.width * self.block_size,
            seq_lens_cpu=[1] * b,  # placeholder: the graphed (Triton) path never reads host lengths
            query_lens_cpu=[1] * b,
        )
        return self._dev64[:b], self._dev64[a : a + b], meta

    def mixed_views(self, num_tokens: int, num_seqs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, meta) of a mixed step padded to num_tokens tokens over num_seqs
        sequences: the static inputs of its graph. max_query_len is the padded token count (the
        prefill kernel's tile choice; every real step of the bucket picks the same tiles)."""
        t, s, a, sa = num_tokens, num_seqs, _align(num_tokens), _align(num_seqs + 1)
        meta = AttentionMetadata(
            slot_mapping=self._dev64[2 * a : 2 * a + t],
            block_tables=self.block_tables[:s],
            seq_lens=self._dev32[:s],
            query_start_loc=self._dev32[sa : sa + s + 1],
            max_query_len=t,
            max_seq_len=self.width * self.block_size,
            seq_lens_cpu=[t] * s,  # placeholder: the graphed path never reads host lengths
            query_lens_cpu=[t] * s,
        )
        return self._dev64[:t], self._dev64[a : a + t], meta

    def fill_dummy_mixed(self, num_tokens: int, num_seqs: int) -> None:
        """A harmless mixed batch for warm-up and capture: num_tokens tokens spread evenly over
        num_seqs fresh sequences, token 0, no KV write (slot -1), keys read from block 0."""
        self._wait_for_last_copy()
        t, s, a, sa = num_tokens, num_seqs, _align(num_tokens), _align(num_seqs + 1)
        per_seq = -(-t // s)
        starts = np.minimum(self._arange[: s + 1] * per_seq, t)
        self._np64[: 2 * a] = 0
        self._np64[2 * a : 2 * a + t] = -1
        self._np32[:s] = starts[1:] - starts[:-1]
        self._np32[sa : sa + s + 1] = starts
        self._copy(2 * a + t, sa + s + 1)
        self.block_tables[:s].zero_()
        self._row_blocks[:s] = [None] * s

    def fill_dummy_decode(self, num_rows: int) -> None:
        """A harmless decode batch for warm-up and capture: token 0 at position 0, no KV write
        (slot -1), one key read from block 0."""
        self._wait_for_last_copy()
        b, a, sa = num_rows, _align(num_rows), _align(num_rows + 1)
        self._np64[: 2 * a] = 0
        self._np64[2 * a : 2 * a + b] = -1
        self._np32[:b] = 1
        self._np32[sa : sa + b + 1] = self._arange[: b + 1]
        self._copy(2 * a + b, sa + b + 1)
        self.block_tables[:b].zero_()
        self._row_blocks[:b] = [None] * b  # the device rows no longer match the host rows

    def invalidate_tables(self) -> None:
        """Forget which block-table rows the device holds (after a step failed half-way): every
        row is rewritten and copied the next time it is used."""
        self._row_blocks = [None] * self.max_num_seqs

    # ---- one step ---------------------------------------------------------------
    def prepare(
        self,
        scheduled: list[ScheduledRequest],
        num_tokens: int,
        pad_to: tuple[int, int] | None = None,
        pending: SampledTokens | None = None,
    ) -> StepInputs:
        """Stages the step's batch and starts its copies to the device.

        Args:
            scheduled: the scheduler's items, in order.
            num_tokens: their total new tokens.
            pad_to: (tokens, sequences) of the graph bucket that replays the step. A decode
                bucket (b, b) takes a decode step (one token per item): rows past the real ones
                get token 0, position 0, slot -1 (no KV write) and seq_len 0 (no KV read). A
                mixed bucket (T_b > S_b) takes any step: tokens past the real ones get token 0,
                position 0, slot -1; sequences past them get seq_len 0 and no new token.
            pending: the tokens of the step launched before this one, on the device: where a
                request's token that the host has not read yet is found.
        """
        self._wait_for_last_copy()
        num_seqs = len(scheduled)
        pad_tokens, padded = pad_to if pad_to is not None else (num_tokens, num_seqs)
        decode = pad_tokens == padded
        if pad_tokens < num_tokens or padded < num_seqs or (decode and num_tokens != num_seqs):
            raise ValueError(f"pad_to {pad_to} cannot hold a step of {num_seqs} sequences and {num_tokens} tokens"
                             + (" (a decode bucket needs one token per sequence)" if decode else ""))  # fmt: skip
        t = pad_tokens
        a, sa = _align(t), _align(padded + 1)
        width_used, tables_changed = self._update_tables(scheduled)
        waiting: list[tuple[int, Request]] = []  # (input index, request) of pending tokens
        if decode:
            seq_lens, query_lens = self._fill_decode(scheduled, padded, waiting)
            sampling = [i for i, item in enumerate(scheduled) if item.samples]
            rows = sampling  # one token per row: token index == item index
        else:
            seq_lens, query_lens, rows, sampling = self._fill_mixed(scheduled, num_tokens, (t, padded), waiting)
        identity_rows = decode and len(rows) == num_seqs
        num_rows = 0 if identity_rows else len(rows)
        self._np64[3 * a : 3 * a + num_rows] = rows[:num_rows]
        n64 = 3 * a + num_rows
        pending_at = 3 * a + _align(num_rows)
        prefix = bool(waiting) and _inputs_are_a_prefix(waiting)
        if waiting:
            n64 = self._stage_pending(waiting, pending, pending_at, prefix)
        bt_offset = 2 * sa
        n32 = bt_offset
        if tables_changed:
            staging = self._np32[bt_offset : bt_offset + num_seqs * width_used].reshape(num_seqs, width_used)
            staging[...] = self._host_tables[:num_seqs, :width_used]
            n32 += num_seqs * width_used
        self._copy(n64, n32)
        if waiting:
            p = len(waiting)
            src = self._dev64[pending_at : pending_at + p]
            # into input_ids [T] (views that do not overlap the indices they are given)
            if prefix:  # inputs 0..p-1, a decode step's rows: one op
                torch.index_select(pending.token_ids, 0, src, out=self._dev64[:p])
                self.num_prefix_gathers += 1
            else:
                dst = self._dev64[pending_at + p : pending_at + 2 * p]
                self._dev64[:t].index_copy_(0, dst, pending.token_ids.index_select(0, src))
                self.num_scattered_gathers += 1
        if tables_changed:
            src = self._dev32[bt_offset : bt_offset + num_seqs * width_used].view(num_seqs, width_used)
            self.block_tables[:num_seqs, :width_used].copy_(src)
        meta = AttentionMetadata(
            slot_mapping=self._dev64[2 * a : 2 * a + t],
            block_tables=self.block_tables[:padded],
            seq_lens=self._dev32[:padded],
            query_start_loc=self._dev32[sa : sa + padded + 1],
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            seq_lens_cpu=seq_lens + [0] * (padded - num_seqs),
            query_lens_cpu=query_lens + [1 if decode else 0] * (padded - num_seqs),
        )
        logits_rows = None if identity_rows else self._dev64[3 * a : 3 * a + num_rows]
        return StepInputs(self._dev64[:t], self._dev64[a : a + t], meta, num_seqs, padded, logits_rows, sampling)

    def _update_tables(self, scheduled: list[ScheduledRequest]) -> tuple[int, bool]:
        """Brings host block-table rows up to date; returns (M, whether any row changed)."""
        tables = self._host_tables
        row_blocks, row_len = self._row_blocks, self._row_len
        width_used = 1
        changed = False
        for i, item in enumerate(scheduled):
            blocks = item.block_ids
            n = len(blocks)
            if n > width_used:
                width_used = n
            if n > self.width:
                raise ValueError(f"a sequence holds {n} blocks, more than the block table's width {self.width}")
            done = row_len[i]
            if row_blocks[i] is blocks and done <= n:
                if done < n:
                    tables[i, done:n] = blocks[done:]
                    row_len[i] = n
                    changed = True
                continue
            tables[i, :n] = blocks
            row_blocks[i] = blocks
            row_len[i] = n
            changed = True
        return width_used, changed

    def _stage_pending(
        self, waiting: list[tuple[int, Request]], pending: SampledTokens | None, offset: int, prefix: bool
    ) -> int:
        """Stages the pending tokens' rows in `pending` at `offset`, then their input indices unless those
        are 0..P-1 (`prefix`); returns the end of the staged int64 data."""
        if pending is None:
            raise RuntimeError("a request's newest token is pending but no launched step holds it")
        row_of = pending.row_of
        try:
            sources = [row_of[request] for _, request in waiting]
        except KeyError as exc:
            missing = exc.args[0].request_id
            raise RuntimeError(f"request {missing} has a pending token the last step did not sample") from exc
        p = len(waiting)
        self._np64[offset : offset + p] = sources
        if prefix:
            return offset + p
        self._np64[offset + p : offset + 2 * p] = [index for index, _ in waiting]
        return offset + 2 * p

    def _fill_decode(
        self, scheduled: list[ScheduledRequest], padded: int, waiting: list[tuple[int, Request]]
    ) -> tuple[list[int], list[int]]:
        """One token per item: ids, positions, slots, seq_lens, query_start_loc, padded to `padded`
        rows; returns (seq_lens, query_lens) and appends pending tokens to `waiting`."""
        bs = self.block_size
        positions = [item.num_computed_tokens for item in scheduled]
        n = len(positions)
        a, sa = _align(padded), _align(padded + 1)
        np64, np32 = self._np64, self._np32
        ids = []
        for i, (item, p) in enumerate(zip(scheduled, positions)):
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
        np32[sa : sa + padded + 1] = self._arange[: padded + 1]
        return seq_lens, [1] * n

    def _fill_mixed(
        self,
        scheduled: list[ScheduledRequest],
        num_tokens: int,
        padded: tuple[int, int],
        waiting: list[tuple[int, Request]],
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """Any mix of prefill chunks and decodes, padded to `padded` (tokens, sequences); returns
        (seq_lens, query_lens, logits rows, sampling items) and appends pending tokens to `waiting`."""
        bs = self.block_size
        np64, np32 = self._np64, self._np32
        num_seqs = len(scheduled)
        pad_tokens, pad_seqs = padded
        a, sa = _align(pad_tokens), _align(pad_seqs + 1)
        t = 0
        seq_lens, query_lens, rows, sampling = [], [], [], []
        for i, item in enumerate(scheduled):
            start, n = item.num_computed_tokens, item.num_new_tokens
            end = start + n
            tokens = item.request.all_token_ids
            if end <= len(tokens):
                np64[t : t + n] = tokens[start:end]
            else:  # only the newest token can be pending
                np64[t : t + n - 1] = tokens[start : end - 1]
                np64[t + n - 1] = 0
                waiting.append((t + n - 1, item.request))
            pos = self._arange[start:end]
            np64[a + t : a + t + n] = pos
            np64[2 * a + t : 2 * a + t + n] = self._host_tables[i, pos // bs] * bs + pos % bs
            t += n
            seq_lens.append(end)
            query_lens.append(n)
            np32[sa + i + 1] = t
            if item.samples:
                rows.append(t - 1)
                sampling.append(i)
        np32[:num_seqs] = seq_lens
        np32[sa] = 0
        if pad_tokens > t:
            np64[t:pad_tokens] = 0
            np64[a + t : a + pad_tokens] = 0
            np64[2 * a + t : 2 * a + pad_tokens] = -1
        if pad_seqs > num_seqs:
            np32[num_seqs:pad_seqs] = 0
            np32[sa + num_seqs + 1 : sa + pad_seqs + 1] = t
        return seq_lens, query_lens, rows, sampling

    def _copy(self, n64: int, n32: int) -> None:
        non_blocking = self._copied is not None
        self._dev64[:n64].copy_(self._host64[:n64], non_blocking=non_blocking)
        self._dev32[:n32].copy_(self._host32[:n32], non_blocking=non_blocking)
        if self._copied is not None:
            self._copied.record()

    def _wait_for_last_copy(self) -> None:
        """NOTE: the host buffers are rewritten only once the last step's copies have left them
        (a step that samples nothing never syncs with the device)."""
        if self._copied is not None:
            self._copied.synchronize()
