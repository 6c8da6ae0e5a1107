"""A verification step staged as decode rows: a sequence verifying k proposed tokens becomes k + 1 one-token rows
over the same block table, row j at position L - 1 + j seeing the keys up to it.

The forward of a decode row stores its token's K/V before attention reads the cache, and a row reads only the
keys below its own length: row j sees the newest token and d_1..d_j, which rows 0..j of the same step wrote, and
nothing of the rows after it. So k + 1 decode rows compute exactly the causal attention of a k + 1 token chunk.
They take the decode step's CUDA graph (one-token kernels: GEMV, decode attention, the fused norms) rather than
a mixed bucket's (the GEMMs and the prefill kernel of a 16-token step), at batch 1 a third of the device time
(decision 0069), and the greedy kernel inside that graph chooses every row's token. The rows also compute each
token as a plain decode step of the same sequence would, so greedy verification on the GPU agrees with decoding
without speculation (the prefill kernel's bf16 rounding breaks near-ties differently).

Only a step of decodes takes this form: each item one token at the end of its sequence (no prefill chunk) or a
verifying item.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler import ScheduledRequest


@dataclass
class DecodeRows:
    """A verification step as decode rows.

    Args:
        rows: one ScheduledRequest of one token per row (a verifying item's k + 1 rows, in position order).
        token_ids: each row's input token (a verifying row past the first: the proposed token before it).
        item_of_row: the index in the step's items of each row.
    """

    rows: list[ScheduledRequest]
    token_ids: list[int]
    item_of_row: list[int]


def as_decode_rows(items: list[ScheduledRequest], max_rows: int) -> DecodeRows | None:
    """The step as decode rows, or None where some item is not a decode (a prefill chunk, a token the host has
    not read) or the rows would be more than max_rows (the most sequences a step stages)."""
    if sum(len(item.proposed_token_ids) + 1 for item in items) > max_rows:
        return None
    rows: list[ScheduledRequest] = []
    token_ids: list[int] = []
    item_of_row: list[int] = []
    for index, item in enumerate(items):
        tokens = item.request.all_token_ids
        start = item.num_computed_tokens
        proposed = item.proposed_token_ids
        if start != len(tokens) - 1 or item.num_new_tokens != len(proposed) + 1 or not item.samples:
            return None
        if not proposed:
            rows.append(item)
            token_ids.append(tokens[start])
            item_of_row.append(index)
            continue
        inputs = [tokens[start], *proposed]
        for j, token in enumerate(inputs):
            rows.append(ScheduledRequest(item.request, 1, start + j, item.block_ids, True))
            token_ids.append(token)
            item_of_row.append(index)
    return DecodeRows(rows, token_ids, item_of_row)
