"""One step's flat batch, staged in pinned host buffers allocated once and brought to the
device by one kernel that reads them there (kernels/stage_batch.py): no torch.tensor() from
Python lists per step, and no copy-engine op at the head of a step.

Legend: T = tokens of the step (after padding), S = sequences (after padding), R = rows
that sample, M = block-table columns in use this step, W = block-table width (most
blocks one sequence can hold), Smax = most sequences in a step.

Two packed buffers, host staging (pinned on CUDA) and device mirror, same offsets, each
field starting at a multiple of a = align(T) or b = align(S + 1) elements (align rounds up to
16, so every pointer a kernel gets is 16-byte aligned and Triton compiles one variant):

    i64: [input_ids T | pad | positions T at a | pad | slot_mapping T at 2a | pad | logits_rows R at 3a
          (S_b of them in a step padded to a mixed bucket: row 0 past the step's own)]
    i32: [seq_lens S | pad | query_start_loc S+1 at b | pad | block-table rows S x M at 2b (host only)]

The offsets depend only on (T, S), so a CUDA graph captured for a decode batch of S = T = b
rows reads its inputs at the offsets every padded decode step of b rows writes (see
`decode_views`), and one captured for a mixed step padded to (T_b, S_b) at the offsets every
step padded to that bucket writes (`mixed_views`). The block table the kernels read is a separate device tensor
[Smax, W]: its width is fixed so one captured graph reads any step's table. Each step writes
only the M used columns of its rows into it, straight from the host staging, and only when a
row changed.

Host-side, the block table is kept per row and updated incrementally: a row that holds the
same request as last step only appends its new blocks.

Pending tokens (async scheduling): a request's newest token may have been sampled by the
step launched just before this one without the host having read it. Its input id is staged
as -1 - r, r its row in that step's sampled tokens (`pending`), where the staging kernel reads
it on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine import ops
from engine.attention_metadata import AttentionMetadata
from engine.block_table_rows import HostBlockTables
from engine.launched_step import SampledTokens
from engine.request import Request
from engine.scheduler import ScheduledRequest
from engine.step_fill import StepFill, align
from kernels.stage_batch import StagingBuffers


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
        sampling: ScheduledRequest index of each sampling row, in order (a request verifying k proposed
            tokens has k + 1 rows).
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
        num_fresh_keys: a decode step's newest positions per row that its own KV store may write (the metadata's
            num_fresh_keys): 1, or 1 + k where verification steps run as decode rows (engine/verify_rows.py).
    """

    def __init__(
        self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int, block_size: int, device: torch.device,
        num_fresh_keys: int = 1,
    ) -> None:  # fmt: skip
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.device = device
        self.num_fresh_keys = num_fresh_keys
        pin = device.type == "cuda"
        # logits rows: one per sequence, or up to one per token when sequences verify proposed tokens
        n64 = 3 * align(max_num_tokens) + align(max(max_num_seqs, max_num_tokens))
        n32 = 2 * align(max_num_seqs + 1) + max_num_seqs * max_blocks_per_seq
        self._host64 = torch.zeros(n64, dtype=torch.int64, pin_memory=pin)
        self._host32 = torch.zeros(n32, dtype=torch.int32, pin_memory=pin)
        self._np64 = self._host64.numpy()
        self._np32 = self._host32.numpy()
        self._dev64 = torch.zeros(n64, dtype=torch.int64, device=device)
        # the device needs only the head: the staged table rows go straight into block_tables
        self._dev32 = torch.zeros(2 * align(max_num_seqs + 1), dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((max_num_seqs, max_blocks_per_seq), dtype=torch.int32, device=device)
        self._tables = HostBlockTables(max_num_seqs, max_blocks_per_seq)
        self._host_tables = self._tables.rows
        self._buffers = StagingBuffers(self._host64, self._dev64, self._host32, self._dev32, self.block_tables)
        self._arange = np.arange(max(max_num_tokens, max_blocks_per_seq * block_size) + 1, dtype=np.int64)
        self._fill = StepFill(self._np64, self._np32, self._host_tables, self._arange, block_size)
        self._copied = torch.cuda.Event() if pin else None  # recorded behind the kernel that reads the host buffers
        self.num_pending_staged = 0  # input ids staged as pending (tests: async steps took the device's tokens)
        # the int64 and int32 elements and block-table rows the last `prepare` staged (tensor-parallel broadcast)
        self.staged = (0, 0, 0)

    # ---- the views a captured graph reads ---------------------------------------
    def decode_views(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, meta) of a decode step of `num_rows` rows: the static inputs of its graph."""
        b, a, sa = num_rows, align(num_rows), align(num_rows + 1)
        meta = AttentionMetadata(
            slot_mapping=self._dev64[2 * a : 2 * a + b],
            block_tables=self.block_tables[:b],
            seq_lens=self._dev32[:b],
            query_start_loc=self._dev32[sa : sa + b + 1],
            max_query_len=1,
            max_seq_len=self.width * self.block_size,
            seq_lens_cpu=[1] * b,  # placeholder: the graphed (Triton) path never reads host lengths
            query_lens_cpu=[1] * b,
            num_fresh_keys=self.num_fresh_keys,
        )
        return self._dev64[:b], self._dev64[a : a + b], meta

    def mixed_views(self, num_tokens: int, num_seqs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, meta) of a mixed step padded to num_tokens tokens over num_seqs
        sequences: the static inputs of its graph. max_query_len is the padded token count (the
        prefill kernel's tile choice; every real step of the bucket picks the same tiles)."""
        t, s, a, sa = num_tokens, num_seqs, align(num_tokens), align(num_seqs + 1)
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

    def mixed_sampling_rows(self, num_tokens: int, num_seqs: int) -> torch.Tensor:
        """[num_seqs] int64: the sampling rows of a step padded to this mixed bucket, as its graph reads them
        (the step's R rows, then row 0 for each sequence past them: `prepare` stages them so)."""
        a = align(num_tokens)
        return self._dev64[3 * a : 3 * a + num_seqs]

    def fill_dummy_mixed(self, num_tokens: int, num_seqs: int) -> None:
        """A harmless mixed batch for warm-up and capture: num_tokens tokens spread evenly over
        num_seqs fresh sequences, token 0, no KV write (slot -1), keys read from block 0."""
        self._wait_for_last_staging()
        t, s, a, sa = num_tokens, num_seqs, align(num_tokens), align(num_seqs + 1)
        per_seq = -(-t // s)
        starts = np.minimum(self._arange[: s + 1] * per_seq, t)
        self._np64[: 2 * a] = 0
        self._np64[2 * a : 2 * a + t] = -1
        self._np32[:s] = starts[1:] - starts[:-1]
        self._np32[sa : sa + s + 1] = starts
        self._np64[3 * a : 3 * a + s] = 0  # sampling rows: every sequence samples token 0's hidden state
        self._stage(3 * a + s, sa + s + 1)
        self.block_tables[:s].zero_()
        self._tables.forget(s)

    def fill_dummy_decode(self, num_rows: int) -> None:
        """A harmless decode batch for warm-up and capture: token 0 at position 0, no KV write
        (slot -1), one key read from block 0."""
        self._wait_for_last_staging()
        b, a, sa = num_rows, align(num_rows), align(num_rows + 1)
        self._np64[: 2 * a] = 0
        self._np64[2 * a : 2 * a + b] = -1
        self._np32[:b] = 1
        self._np32[sa : sa + b + 1] = self._arange[: b + 1]
        self._stage(2 * a + b, sa + b + 1)
        self.block_tables[:b].zero_()
        self._tables.forget(b)  # the device rows no longer match the host rows

    def invalidate_tables(self) -> None:
        """Forget which block-table rows the device holds (after a step failed half-way): every
        row is rewritten and copied the next time it is used."""
        self._tables.forget(self.max_num_seqs)

    # ---- one step ---------------------------------------------------------------
    def prepare(
        self,
        scheduled: list[ScheduledRequest],
        num_tokens: int,
        pad_to: tuple[int, int] | None = None,
        pending: SampledTokens | None = None,
        token_ids: list[int] | None = None,
    ) -> StepInputs:
        """Stages the step's batch and launches the kernel that brings it to the device.

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
            token_ids: a decode step's input ids, one per item, where the items' requests do not hold them
                (a verification step as decode rows: engine/verify_rows.py); None reads them there.
        """
        self._wait_for_last_staging()
        num_seqs = len(scheduled)
        pad_tokens, padded = pad_to if pad_to is not None else (num_tokens, num_seqs)
        decode = pad_tokens == padded
        if token_ids is not None and not (decode and len(token_ids) == num_seqs):
            raise ValueError(f"token_ids are a decode step's, one per item: got {len(token_ids)} for {num_seqs} items")
        if pad_tokens < num_tokens or padded < num_seqs or (decode and num_tokens != num_seqs):
            raise ValueError(f"pad_to {pad_to} cannot hold a step of {num_seqs} sequences and {num_tokens} tokens"
                             + (" (a decode bucket needs one token per sequence)" if decode else ""))  # fmt: skip
        t = pad_tokens
        a, sa = align(t), align(padded + 1)
        width_used, tables_changed = self._tables.update(scheduled)
        waiting: list[tuple[int, Request]] = []  # (input index, request) of pending tokens
        if decode:
            seq_lens, query_lens = self._fill.decode(scheduled, padded, waiting, token_ids)
            sampling = [i for i, item in enumerate(scheduled) if item.samples]
            rows = sampling  # one token per row: token index == item index
        else:
            seq_lens, query_lens, rows, sampling = self._fill.mixed(scheduled, num_tokens, (t, padded), waiting)
        identity_rows = decode and len(rows) == num_seqs
        num_rows = 0 if identity_rows else len(rows)
        self._np64[3 * a : 3 * a + num_rows] = rows[:num_rows]
        staged_rows = num_rows
        if pad_to is not None and not decode:
            # a mixed bucket's graph gathers S_b rows (mixed_sampling_rows): past the step's own, row 0 (a step
            # verifying proposed tokens may have more rows than S_b: all of them are staged)
            self._np64[3 * a + num_rows : 3 * a + padded] = 0
            staged_rows = max(padded, num_rows)
        if waiting:
            self._stage_pending(waiting, pending)
        bt_offset = 2 * sa
        table_rows = num_seqs if tables_changed else 0
        if table_rows:
            staging = self._np32[bt_offset : bt_offset + num_seqs * width_used].reshape(num_seqs, width_used)
            staging[...] = self._host_tables[:num_seqs, :width_used]
        self._stage(3 * a + staged_rows, bt_offset, t, pending.token_ids if waiting else None, table_rows, width_used)
        self.staged = (3 * a + staged_rows, bt_offset, table_rows)
        input_ids, positions, meta = self.step_views(
            t, padded, max(query_lens), max(seq_lens), seq_lens + [0] * (padded - num_seqs),
            query_lens + [1 if decode else 0] * (padded - num_seqs),
        )  # fmt: skip
        logits_rows = None if identity_rows else self._dev64[3 * a : 3 * a + num_rows]
        return StepInputs(input_ids, positions, meta, num_seqs, padded, logits_rows, sampling)

    def step_views(
        self, num_tokens: int, padded: int, max_query_len: int, max_seq_len: int, seq_lens_cpu: list[int],
        query_lens_cpu: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:  # fmt: skip
        """(input_ids, positions, meta) of the step staged for num_tokens tokens over padded sequences: what
        `prepare` returns, and what a tensor-parallel rank rebuilds from rank 0's broadcast (step_mirror.py)."""
        t, a, sa = num_tokens, align(num_tokens), align(padded + 1)
        meta = AttentionMetadata(
            slot_mapping=self._dev64[2 * a : 2 * a + t],
            block_tables=self.block_tables[:padded],
            seq_lens=self._dev32[:padded],
            query_start_loc=self._dev32[sa : sa + padded + 1],
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            seq_lens_cpu=seq_lens_cpu,
            query_lens_cpu=query_lens_cpu,
            num_fresh_keys=self.num_fresh_keys,
        )
        return self._dev64[:t], self._dev64[a : a + t], meta

    def device_buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three device tensors a step's forward reads: int64 head, int32 head, block table [Smax, W]."""
        return self._dev64, self._dev32, self.block_tables

    def _stage_pending(self, waiting: list[tuple[int, Request]], pending: SampledTokens | None) -> None:
        """Stages each pending token's input id as -1 - its row in `pending` (kernels/stage_batch.py
        reads the token there on the device)."""
        if pending is None:
            raise RuntimeError("a request's newest token is pending but no launched step holds it")
        row_of = pending.row_of
        self.num_pending_staged += len(waiting)
        try:
            for index, request in waiting:
                self._np64[index] = -1 - row_of[request]
        except KeyError as exc:
            missing = exc.args[0].request_id
            raise RuntimeError(f"request {missing} has a pending token the last step did not sample") from exc

    def _stage(
        self, n64: int, n32: int, num_ids: int = 0, pending: torch.Tensor | None = None, table_rows: int = 0,
        width: int = 0,
    ) -> None:  # fmt: skip
        """The staged heads (and `table_rows` x `width` table rows after the int32 head) to the device,
        pending input ids among the first `num_ids` taken from `pending` (ops.stage_batch)."""
        ops.stage_batch(self._buffers, n64, num_ids, pending, n32, table_rows, width)
        if self._copied is not None:
            self._copied.record()

    def _wait_for_last_staging(self) -> None:
        """NOTE: the host buffers are rewritten only once the last step's staging kernel has read them
        (a step that samples nothing never syncs with the device)."""
        if self._copied is not None:
            self._copied.synchronize()
