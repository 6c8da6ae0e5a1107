"""Pending tokens (async scheduling) reach their inputs on the device: a request whose newest token the
host has not read yet is staged as -1 - its row in the last step's sampled tokens, and the staging
(kernels/stage_batch.py, or its torch reference) reads the token there, in a decode step and among a
mixed step's known tokens."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.input_batch import InputBatch
from engine.launched_step import SampledTokens
from engine.scheduler import ScheduledRequest

# torch: the reference (the CPU engine); triton: the staging kernel through the CPU interpreter (on a GPU
# machine the batch here is a CPU one, which the kernel cannot read: tests/kernels/test_stage_batch.py and
# the CUDA engine tests take the kernel there)
_INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason="the staging kernel's CPU run (interpreter)")
BACKENDS = pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=_INTERPRETED)])


class _FakeRequest:
    def __init__(self, request_id: str, tokens: list[int]) -> None:
        self.request_id = request_id
        self.all_token_ids = tokens


def _batch() -> InputBatch:
    return InputBatch(max_num_tokens=64, max_num_seqs=8, max_blocks_per_seq=6, block_size=4, device=torch.device("cpu"))


@BACKENDS
def test_a_decode_step_whose_rows_all_wait_reads_them_from_the_last_step(backend: str) -> None:
    batch = _batch()
    # each has computed all its known tokens: the token at its position is the one the last step sampled
    a, b, c = _FakeRequest("a", [1, 2, 3]), _FakeRequest("b", [4, 5]), _FakeRequest("c", [6, 7, 8, 9])
    items = [ScheduledRequest(r, 1, len(r.all_token_ids), [3, 1], True) for r in (a, b, c)]
    last = SampledTokens(torch.tensor([71, 72, 73]), [c, a, b])  # sampled in another order
    with ops.kernel_backend(backend):
        step = batch.prepare(items, 3, pad_to=(4, 4), pending=last)
    assert step.input_ids.tolist() == [72, 73, 71, 0]
    assert step.meta.block_tables[:3, :2].tolist() == [[3, 1]] * 3


@BACKENDS
def test_pending_tokens_among_known_ones_reach_their_inputs(backend: str) -> None:
    batch = _batch()
    a, b = _FakeRequest("a", [10, 11, 12, 13, 14]), _FakeRequest("b", [20, 21])
    # a decodes with its token known on the host; b's newest is pending: its input is the step's 2nd
    items = [ScheduledRequest(a, 1, 4, [2, 5], True), ScheduledRequest(b, 1, 2, [4], True)]
    with ops.kernel_backend(backend):
        step = batch.prepare(items, 2, pad_to=(2, 2), pending=SampledTokens(torch.tensor([90, 91]), [a, b]))
        assert step.input_ids.tolist() == [14, 91]
        assert step.positions.tolist() == [4, 2] and step.meta.slot_mapping.tolist() == [20, 18]
        # a mixed step: a prefill chunk first, then b's pending token
        items = [ScheduledRequest(a, 3, 1, [2, 5], False), ScheduledRequest(b, 1, 2, [4], True)]
        step = batch.prepare(items, 4, pad_to=(16, 7), pending=SampledTokens(torch.tensor([92]), [b]))
    assert step.input_ids.tolist()[:5] == [11, 12, 13, 92, 0]
    assert step.meta.slot_mapping.tolist()[:5] == [9, 10, 11, 18, -1]  # the padding's -1 is kept, not read


def test_a_pending_token_no_launched_step_holds_is_an_error() -> None:
    batch = _batch()
    a, b = _FakeRequest("a", [1, 2]), _FakeRequest("b", [3])
    items = [ScheduledRequest(a, 1, 2, [0], True)]
    with pytest.raises(RuntimeError, match="no launched step holds it"):
        batch.prepare(items, 1, pending=None)
    with pytest.raises(RuntimeError, match="request a has a pending token the last step did not sample"):
        batch.prepare(items, 1, pending=SampledTokens(torch.tensor([5]), [b]))
