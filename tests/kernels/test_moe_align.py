"""Token alignment (kernels/moe_align.py): the kernels' three outputs equal the host reference's, value for
value, over odd expert counts, skewed routings, chunk sizes that split the pairs, and tile heights."""

from __future__ import annotations

import pytest
import torch

from kernels.moe_align import align_sizes, moe_align, moe_align_ref


def routed_ids(num_tokens: int, num_experts: int, top_k: int, seed: int, skew: bool = False) -> torch.Tensor:
    """Distinct experts per token (as top-k gives); skew sends every token to the same few experts."""
    generator = torch.Generator().manual_seed(seed)
    if skew:
        return torch.arange(top_k, dtype=torch.int32).repeat(num_tokens, 1)
    return torch.stack([torch.randperm(num_experts, generator=generator)[:top_k] for _ in range(num_tokens)]).int()


# (tokens, experts, top-k, BLOCK_M, chunk or None for the launcher's)
CASES = [
    (1, 1, 1, 16, None),
    (1, 11, 8, 16, None),
    (7, 5, 2, 16, 1),
    (40, 13, 4, 32, 8),
    (33, 9, 8, 16, 16),
    (5, 60, 3, 64, None),
    (19, 128, 8, 16, 32),
    (3, 7, 7, 128, 2),
]


@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m,chunk", CASES)
@pytest.mark.parametrize("skew", [False, True], ids=["random", "skewed"])
def test_alignment_matches_the_reference(num_tokens, num_experts, top_k, block_m, chunk, skew, device):
    ids = routed_ids(num_tokens, num_experts, top_k, seed=num_tokens + num_experts, skew=skew).to(device)
    got = moe_align(ids, num_experts, block_m, chunk=chunk)
    expected = moe_align_ref(ids, num_experts, block_m)
    for name, g, e in zip(("sorted_ids", "block_experts", "num_padded"), got, expected, strict=True):
        assert torch.equal(g, e), f"{name}: {g.tolist()} != {e.tolist()}"
    sorted_ids, block_experts, num_padded = (t.cpu() for t in got)
    num_pairs = ids.numel()
    real = sorted_ids[sorted_ids < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))  # every pair once
    for block in range(int(num_padded) // block_m):  # each block one expert, that of its pairs
        rows = sorted_ids[block * block_m : (block + 1) * block_m]
        rows = rows[rows < num_pairs].long()
        assert (ids.reshape(-1).cpu()[rows] == block_experts[block]).all()


def test_sizes_cover_the_worst_routing_and_follow_the_shape_alone():
    assert align_sizes(1, 128, 16) == (16, 1)  # one pair: one block
    assert align_sizes(8, 128, 16) == (8 + 8 * 15, 8)  # 8 pairs on 8 experts, each its own block
    assert align_sizes(64, 8, 16) == (64 + 8 * 15 + 8, 12)  # rounded up to whole blocks
    ids = torch.zeros(6, 2, dtype=torch.int32)
    ids[:, 1] = 1
    sorted_ids, _, num_padded = moe_align_ref(ids, 8, 16)
    assert sorted_ids.numel() == align_sizes(12, 8, 16)[0] and int(num_padded) == 32


@pytest.mark.parametrize(
    "ids,num_experts,block_m,message",
    [
        (torch.zeros(2, 2, dtype=torch.int64), 4, 16, "contiguous int32"),
        (torch.zeros(4, dtype=torch.int32), 4, 16, "must have 2 dims"),
        (torch.zeros(2, 2, dtype=torch.int32), 4, 24, "block_m must be a power of two"),
        (torch.zeros(2, 2, dtype=torch.int32), 0, 16, "1 to 1024 experts"),
    ],
)
def test_launcher_names_the_bad_argument(ids, num_experts, block_m, message, device):
    with pytest.raises(ValueError, match=message):
        moe_align(ids.to(device), num_experts, block_m)
