"""The host's copy of each step's block-table rows, kept up to date incrementally: a row that holds the same
request as last step only appends its new blocks, and the step copies rows to the device only when one changed
(engine/input_batch.py stages them)."""

from __future__ import annotations

import numpy as np

from engine.scheduler import ScheduledRequest


class HostBlockTables:
    """Rows [Smax, W] of block ids, one per batch row.

    Args:
        max_num_seqs: Smax.
        width: W, the most blocks one sequence can hold.
    """

    def __init__(self, max_num_seqs: int, width: int) -> None:
        self.width = width
        self.rows = np.zeros((max_num_seqs, width), dtype=np.int32)
        # NOTE: a row is reused as-is when it holds the same block list object as last step:
        # the block manager's lists only grow while their request holds its blocks (a freed
        # request's list is dropped and a new one made on reallocation). Holding the reference
        # keeps its id from being reused.
        self._row_blocks: list[list[int] | None] = [None] * max_num_seqs
        self._row_len = [0] * max_num_seqs

    def forget(self, num_rows: int) -> None:
        """Rows 0..num_rows-1 no longer match the device's (a warm-up batch, a failed step): rewritten next time."""
        self._row_blocks[:num_rows] = [None] * num_rows

    def update(self, scheduled: list[ScheduledRequest]) -> tuple[int, bool]:
        """Brings the rows of the step's items up to date; returns (M, the widest row, whether any row changed)."""
        tables = self.rows
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
