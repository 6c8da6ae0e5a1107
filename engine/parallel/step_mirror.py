"""Rank 0 sending each step's forward to the other ranks, and a rank receiving it.

Legend: T = the step's tokens (padded), S = its sequences (padded).

Every rank holds the same ModelRunner, built from the same configuration: the same staging buffers, graph
buckets and KV pool size, and its own shard of the model and of the KV heads. Rank 0 alone schedules,
stages and samples; after it stages a step, `StepMirror.send` broadcasts what the forward reads: a header
(which graph bucket replays it, or that it runs eagerly, and the attention metadata's host-side values) and
the heads of the three device buffers the staging kernel wrote (token ids, positions, slots and sampling rows;
sequence lengths and query starts; the block table's rows). A rank receives them into its own buffers
(`receive`) and runs the same forward, so every collective inside it meets its peers'. The LM head and
sampling run on rank 0 only (the head is replicated: decision 0061).

NOTE: the broadcasts are queued on the device's stream behind the staging kernel, so they read what it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from engine.input_batch import InputBatch, StepInputs
from engine.parallel.group import TensorParallel, group_broken


@dataclass
class StepHeader:
    """What a rank needs besides the device buffers to run the step's forward as rank 0 does.

    Args:
        op: "step" (a forward), "stop" (the engine is closing: leave the loop).
        bucket: the graph bucket (tokens, sequences) that replays it, or None: an eager forward.
        greedy: the replay's greedy variant (StepGraphs.run).
        num_tokens, num_padded: T and S.
        max_query_len, max_seq_len, seq_lens_cpu, query_lens_cpu: the metadata's host-side values.
        n64, n32, table_rows: how much of each device buffer the step uses.
    """

    op: str
    bucket: tuple[int, int] | None = None
    greedy: bool = False
    num_tokens: int = 0
    num_padded: int = 0
    max_query_len: int = 0
    max_seq_len: int = 0
    seq_lens_cpu: list[int] | None = None
    query_lens_cpu: list[int] | None = None
    n64: int = 0
    n32: int = 0
    table_rows: int = 0


class StepMirror:
    """Rank 0's side and the other ranks' side of each step's broadcast, over one InputBatch per rank.

    Args:
        tp: this rank's group (size > 1).
        inputs: this rank's staging buffers.
    """

    def __init__(self, tp: TensorParallel, inputs: InputBatch) -> None:
        self.tp = tp
        self.inputs = inputs
        self.num_sent = 0

    def send(self, header: StepHeader) -> None:
        """Rank 0: the step's header, then its device buffers.

        Raises:
            RankGroupBroken: a broadcast failed (gloo: a rank is gone); the group cannot run the step.
        """
        try:
            dist.broadcast_object_list([header], src=0, group=self.tp.group)
            if header.op == "step":
                self._broadcast(header)
        except Exception as exc:
            raise group_broken(f"tensor parallel broadcast of step {self.num_sent} failed: {exc!r}") from exc
        self.num_sent += 1

    def send_step(self, step: StepInputs, bucket: tuple[int, int] | None, greedy: bool) -> None:
        """Rank 0: the step `prepare` just staged, run by graph `bucket` (greedy variant) or eagerly (None)."""
        meta = step.meta
        # the block table's rows only where `prepare` rewrote them: the other ranks hold the rest already
        n64, n32, table_rows = self.inputs.staged
        self.send(StepHeader(
            "step", bucket, greedy, step.input_ids.shape[0], step.num_padded, meta.max_query_len, meta.max_seq_len,
            meta.seq_lens_cpu, meta.query_lens_cpu, n64, n32, table_rows,
        ))  # fmt: skip

    def receive(self) -> StepHeader:
        """Another rank: the next header and, for a step, its buffers written into this rank's InputBatch."""
        box: list[StepHeader | None] = [None]
        dist.broadcast_object_list(box, src=0, group=self.tp.group)
        header = box[0]
        assert header is not None
        if header.op == "step":
            self._broadcast(header)
        return header

    def _broadcast(self, header: StepHeader) -> None:
        dev64, dev32, tables = self.inputs.device_buffers()
        dist.broadcast(dev64[: header.n64], src=0, group=self.tp.group)
        dist.broadcast(dev32[: header.n32], src=0, group=self.tp.group)
        if header.table_rows:
            dist.broadcast(tables[: header.table_rows], src=0, group=self.tp.group)
