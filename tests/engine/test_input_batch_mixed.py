"""A mixed step's staging (engine/step_fill.py computes positions, slots and offsets for all tokens at once)
against a reference built token by token: every item's input ids, positions, KV slots, sequence lengths, query
offsets, logits rows and pending tokens, for random mixes of decodes, prefill chunks, pending newest tokens and
speculative proposals, padded and not."""

from __future__ import annotations

import random

import pytest
import torch

from engine.input_batch import InputBatch
from engine.scheduler import ScheduledRequest
from engine.step_fill import align

BLOCK = 4


class _FakeRequest:
    def __init__(self, request_id: str, tokens: list[int]) -> None:
        self.request_id = request_id
        self.all_token_ids = tokens


def _random_items(rng: random.Random, max_seqs: int, max_tokens: int) -> list[ScheduledRequest]:
    items, total = [], 0
    for i in range(rng.randint(1, max_seqs)):
        length = rng.randint(1, 120)
        tokens = [rng.randint(1, 999) for _ in range(length)]
        kind, proposed = rng.choice(("decode", "pending", "chunk", "proposal")), []
        if kind == "decode":  # the newest token known on the host
            start, n = length - 1, 1
        elif kind == "pending":  # the newest token still on the device
            start, n = length, 1
        elif kind == "chunk":
            start = rng.randint(0, length - 1)
            n = rng.randint(1, length - start)
        else:
            start, proposed = length - 1, [rng.randint(1, 999) for _ in range(rng.randint(1, 3))]
            n = 1 + len(proposed)
        if total + n > max_tokens:
            break
        total += n
        blocks = rng.sample(range(500), -(-(start + n) // BLOCK))
        items.append(ScheduledRequest(_FakeRequest(f"r{i}", tokens), n, start, blocks, rng.random() < 0.7, proposed))
    return items


def _reference(items: list[ScheduledRequest]) -> dict:
    ids, positions, slots, rows, sampling, pending, offsets = [], [], [], [], [], [], [0]
    for i, item in enumerate(items):
        tokens = item.request.all_token_ids + item.proposed_token_ids
        for p in range(item.num_computed_tokens, item.num_computed_tokens + item.num_new_tokens):
            if p < len(tokens):
                ids.append(tokens[p])
            else:
                pending.append((len(ids), item.request.request_id))
                ids.append(0)
            positions.append(p)
            slots.append(item.block_ids[p // BLOCK] * BLOCK + p % BLOCK)
        offsets.append(len(ids))
        if item.proposed_token_ids:
            rows += range(len(ids) - len(item.proposed_token_ids) - 1, len(ids))
            sampling += [i] * (len(item.proposed_token_ids) + 1)
        elif item.samples:
            rows.append(len(ids) - 1)
            sampling.append(i)
    seq_lens = [item.num_computed_tokens + item.num_new_tokens for item in items]
    return {"ids": ids, "positions": positions, "slots": slots, "rows": rows, "sampling": sampling,
            "pending": pending, "offsets": offsets, "seq_lens": seq_lens}  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_a_mixed_step_stages_every_token_as_the_token_by_token_reference(seed: int) -> None:
    rng = random.Random(seed)
    batch = InputBatch(max_num_tokens=256, max_num_seqs=16, max_blocks_per_seq=40, block_size=BLOCK,
                       device=torch.device("cpu"))  # fmt: skip
    items = _random_items(rng, 16, 200)
    num_tokens, num_seqs = sum(item.num_new_tokens for item in items), len(items)
    pad_tokens, pad_seqs = (256, 16) if seed % 2 else (num_tokens, num_seqs)
    batch._tables.update(items)
    waiting = []
    seq_lens, query_lens, rows, sampling = batch._fill.mixed(items, num_tokens, (pad_tokens, pad_seqs), waiting)
    expected = _reference(items)
    np64, np32 = batch._np64, batch._np32
    a, sa = align(pad_tokens), align(pad_seqs + 1)
    assert np64[:num_tokens].tolist() == expected["ids"]
    assert np64[a : a + num_tokens].tolist() == expected["positions"]
    assert np64[2 * a : 2 * a + num_tokens].tolist() == expected["slots"]
    assert (np64[num_tokens:pad_tokens] == 0).all() and (np64[2 * a + num_tokens : 2 * a + pad_tokens] == -1).all()
    assert np32[:num_seqs].tolist() == expected["seq_lens"] == seq_lens
    assert (np32[num_seqs:pad_seqs] == 0).all()
    assert np32[sa : sa + num_seqs + 1].tolist() == expected["offsets"]
    assert (np32[sa + num_seqs + 1 : sa + pad_seqs + 1] == num_tokens).all()
    assert query_lens == [item.num_new_tokens for item in items]
    assert (rows, sampling) == (expected["rows"], expected["sampling"])
    assert [(index, request.request_id) for index, request in waiting] == expected["pending"]
