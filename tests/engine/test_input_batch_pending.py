"""Pending tokens (async scheduling) reach their inputs on the device: a request whose newest token the
host has not read yet gets it from the last step's sampled tokens, by one index_select where the pending
inputs are 0..P-1 (a decode step's rows) and by a gather and a scatter anywhere else."""

from __future__ import annotations

import torch

from engine.input_batch import InputBatch
from engine.launched_step import SampledTokens
from engine.scheduler import ScheduledRequest


class _FakeRequest:
    def __init__(self, request_id: str, tokens: list[int]) -> None:
        self.request_id = request_id
        self.all_token_ids = tokens


def _batch() -> InputBatch:
    return InputBatch(max_num_tokens=64, max_num_seqs=8, max_blocks_per_seq=6, block_size=4, device=torch.device("cpu"))


def test_a_decode_step_whose_rows_all_wait_takes_them_in_one_gather() -> None:
    batch = _batch()
    # each has computed all its known tokens: the token at its position is the one the last step sampled
    a, b, c = _FakeRequest("a", [1, 2, 3]), _FakeRequest("b", [4, 5]), _FakeRequest("c", [6, 7, 8, 9])
    items = [ScheduledRequest(r, 1, len(r.all_token_ids), [3, 1], True) for r in (a, b, c)]
    last = SampledTokens(torch.tensor([71, 72, 73]), [c, a, b])  # sampled in another order
    step = batch.prepare(items, 3, pad_to=(4, 4), pending=last)
    assert step.input_ids.tolist() == [72, 73, 71, 0]
    assert (batch.num_prefix_gathers, batch.num_scattered_gathers) == (1, 0)


def test_pending_tokens_among_known_ones_are_scattered_to_their_inputs() -> None:
    batch = _batch()
    a, b = _FakeRequest("a", [10, 11, 12, 13, 14]), _FakeRequest("b", [20, 21])
    # a decodes with its token known on the host; b's newest is pending: its input is the step's 2nd
    items = [ScheduledRequest(a, 1, 4, [2, 5], True), ScheduledRequest(b, 1, 2, [4], True)]
    step = batch.prepare(items, 2, pad_to=(2, 2), pending=SampledTokens(torch.tensor([90, 91]), [a, b]))
    assert step.input_ids.tolist() == [14, 91]
    # a mixed step: a prefill chunk first, then b's pending token
    items = [ScheduledRequest(a, 3, 1, [2, 5], False), ScheduledRequest(b, 1, 2, [4], True)]
    step = batch.prepare(items, 4, pad_to=(16, 7), pending=SampledTokens(torch.tensor([92]), [b]))
    assert step.input_ids.tolist()[:5] == [11, 12, 13, 92, 0]
    assert (batch.num_prefix_gathers, batch.num_scattered_gathers) == (0, 2)
