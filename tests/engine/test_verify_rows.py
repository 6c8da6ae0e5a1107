"""A verification step as decode rows (engine/verify_rows.py): staged, every row holds what the same token holds in
the step staged as a mixed step (its input id, position and KV slot), with the length of the keys it sees (its
position + 1, not the chunk's end) and its sequence's block-table row; steps that are not all decodes, or whose rows
are more than a step stages, keep the mixed form."""

from __future__ import annotations

import random

import pytest
import torch

from engine.input_batch import InputBatch
from engine.scheduler import ScheduledRequest
from engine.step_fill import align
from engine.verify_rows import as_decode_rows
from tests.engine.test_input_batch_mixed import BLOCK, _FakeRequest, _reference


def _decode_items(rng: random.Random, num_seqs: int) -> list[ScheduledRequest]:
    """Decodes with the newest token on the host, some verifying 1..4 proposed tokens."""
    items = []
    for i in range(num_seqs):
        length = rng.randint(1, 120)
        tokens = [rng.randint(1, 999) for _ in range(length)]
        proposed = [rng.randint(1, 999) for _ in range(rng.randint(1, 4))] if rng.random() < 0.7 else []
        n = 1 + len(proposed)
        blocks = rng.sample(range(500), -(-(length - 1 + n) // BLOCK))
        items.append(ScheduledRequest(_FakeRequest(f"r{i}", tokens), n, length - 1, blocks, True, proposed))
    return items


@pytest.mark.parametrize("seed", range(12))
def test_decode_rows_stage_each_token_as_the_mixed_step_does_with_its_own_key_length(seed: int) -> None:
    rng = random.Random(seed)
    items = _decode_items(rng, rng.randint(1, 6))
    if not any(item.proposed_token_ids for item in items):
        items[0] = ScheduledRequest(items[0].request, 3, items[0].num_computed_tokens, items[0].block_ids + [7], True,
                                    [5, 6])  # fmt: skip
    rows = as_decode_rows(items, max_rows=32)
    assert rows is not None
    expected = _reference(items)  # the same step as a mixed step, token by token
    num_rows = len(rows.rows)
    assert num_rows == len(expected["ids"])
    batch = InputBatch(max_num_tokens=64, max_num_seqs=32, max_blocks_per_seq=40, block_size=BLOCK,
                       device=torch.device("cpu"))  # fmt: skip
    padded = 32 if seed % 2 else num_rows
    step = batch.prepare(rows.rows, num_rows, pad_to=(padded, padded), token_ids=rows.token_ids)
    np64, np32 = batch._np64, batch._np32
    a, sa = align(padded), align(padded + 1)
    assert np64[:num_rows].tolist() == expected["ids"]
    assert np64[a : a + num_rows].tolist() == expected["positions"]
    assert np64[2 * a : 2 * a + num_rows].tolist() == expected["slots"]
    assert np32[:num_rows].tolist() == [p + 1 for p in expected["positions"]]  # each row sees the keys up to itself
    assert np32[sa : sa + num_rows + 1].tolist() == list(range(num_rows + 1))
    assert (np32[num_rows:padded] == 0).all() and (np64[2 * a + num_rows : 2 * a + padded] == -1).all()
    for row, item_index in enumerate(rows.item_of_row):
        blocks = items[item_index].block_ids
        assert batch.block_tables[row, : len(blocks)].tolist() == blocks
    assert step.logits_rows is None and step.meta.max_query_len == 1  # every row samples, as a decode step's
    assert [rows.item_of_row[r] for r in step.sampling] == expected["sampling"]
    assert batch.num_pending_staged == 0


def test_steps_that_are_not_all_decodes_or_have_too_many_rows_keep_the_mixed_form() -> None:
    tokens = list(range(1, 21))
    request = _FakeRequest("r0", tokens)
    verifying = ScheduledRequest(request, 4, 19, [0, 1, 2, 3, 4, 5], True, [7, 8, 9])
    assert as_decode_rows([verifying], max_rows=4) is not None
    assert as_decode_rows([verifying], max_rows=3) is None  # 4 rows
    chunk = ScheduledRequest(_FakeRequest("r1", tokens), 5, 10, [0, 1, 2, 3, 4], True)
    assert as_decode_rows([verifying, chunk], max_rows=32) is None
    pending = ScheduledRequest(_FakeRequest("r2", tokens), 1, 20, [0, 1, 2, 3, 4, 5], True)  # newest on the device
    assert as_decode_rows([verifying, pending], max_rows=32) is None
    not_sampling = ScheduledRequest(_FakeRequest("r3", tokens), 1, 19, [0, 1, 2, 3, 4], False)
    assert as_decode_rows([verifying, not_sampling], max_rows=32) is None


def test_decode_rows_tokens_are_one_per_row() -> None:
    batch = InputBatch(max_num_tokens=64, max_num_seqs=8, max_blocks_per_seq=8, block_size=BLOCK,
                       device=torch.device("cpu"))  # fmt: skip
    item = ScheduledRequest(_FakeRequest("r0", [1, 2, 3]), 1, 2, [0], True)
    with pytest.raises(ValueError, match="token_ids are a decode step's, one per item: got 2 for 1 items"):
        batch.prepare([item], 1, token_ids=[3, 4])
