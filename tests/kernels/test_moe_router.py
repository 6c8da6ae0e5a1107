"""The fused MoE router (kernels/moe_router.py) against softmax + topk + renormalize in torch."""

from __future__ import annotations

import pytest
import torch

from kernels.moe_router import MAX_EXPERTS, moe_route, moe_route_ref

DTYPES = [
    pytest.param(torch.float32, 1e-6, id="fp32"),
    pytest.param(torch.bfloat16, 1e-6, id="bf16"),  # the softmax runs on the widened logits either way
    pytest.param(torch.float16, 1e-6, id="fp16"),
]
# (tokens, experts, top-k): E neither a power of two nor a multiple of anything, top-k 1 / 2 / 4 / 8
SHAPES = [(1, 1, 1), (3, 5, 2), (17, 60, 4), (40, 128, 8), (7, 9, 8), (33, 13, 1), (2, 8, 2), (5, 64, 8)]


@pytest.mark.parametrize("dtype,atol", DTYPES)
@pytest.mark.parametrize("num_tokens,num_experts,top_k", SHAPES)
@pytest.mark.parametrize("renormalize", [False, True], ids=["raw", "renormalized"])
def test_route_matches_softmax_topk(num_tokens, num_experts, top_k, renormalize, dtype, atol, device):
    # distinct in every dtype (spaced 8 / E, within [-4, 4)), shuffled per token: ties are their own test
    generator = torch.Generator().manual_seed(num_tokens * 1000 + num_experts)
    ranks = torch.stack([torch.randperm(num_experts, generator=generator) for _ in range(num_tokens)])
    logits = (ranks.float() * 8 / num_experts - 4).to(dtype).to(device)
    weights, ids = moe_route(logits, top_k, renormalize)
    expected_weights, expected_ids = moe_route_ref(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=atol, rtol=1e-5)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(num_tokens, device=device))


def test_route_reads_a_strided_row_view(device):
    """Router logits cut out of a wider tensor (a row stride above E) read as the contiguous copy does."""
    wide = torch.randn(9, 20, device=device)
    logits = wide[:, 3:14]
    assert logits.stride(0) == 20
    assert torch.equal(moe_route(logits, 3, True)[1], moe_route(logits.contiguous(), 3, True)[1])


def test_equal_logits_go_to_the_lower_expert(device):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]], device=device)
    weights, ids = moe_route(logits, 2, False)
    assert ids.tolist() == [[1, 2], [0, 1]]
    assert weights[1].tolist() == [pytest.approx(0.2), pytest.approx(0.2)]


def test_a_nan_row_still_names_experts_in_range(device):
    logits = torch.randn(3, 6, device=device)
    logits[1, 2] = float("nan")
    _, ids = moe_route(logits, 4, True)
    assert ((ids >= 0) & (ids < 6)).all()


@pytest.mark.parametrize(
    "logits,top_k,message",
    [
        (torch.zeros(2, 4), 5, r"top_k must be in \[1, 4\]"),
        (torch.zeros(2, 4), 0, r"top_k must be in \[1, 4\]"),
        (torch.zeros(4), 1, r"logits must be \[T, E\]"),
        (torch.zeros(2, MAX_EXPERTS + 1), 2, f"1 to {MAX_EXPERTS} experts"),
        (torch.zeros(2, 4, dtype=torch.int32), 1, "float16, bfloat16 or float32"),
    ],
)
def test_launcher_names_the_bad_argument(logits, top_k, message, device):
    with pytest.raises(ValueError, match=message):
        moe_route(logits.to(device), top_k, True)


def test_the_tile_holds_no_more_token_rows_than_the_batch(monkeypatch):
    """On a GPU (the interpreter takes 2 rows always): a decode step's one token in a [1, E] tile on one warp up to
    256 logits, a large batch TILE_ELEMENTS logits a program."""
    from kernels import moe_router

    monkeypatch.setattr(moe_router, "interpreting", lambda: False)
    assert moe_router.route_tile(128, 1) == {"BLOCK_T": 1, "BLOCK_E": 128, "num_warps": 1}
    assert moe_router.route_tile(60, 3) == {"BLOCK_T": 4, "BLOCK_E": 64, "num_warps": 1}
    assert moe_router.route_tile(128, 16) == {"BLOCK_T": 16, "BLOCK_E": 128, "num_warps": 4}
    assert moe_router.route_tile(128, 8192) == {"BLOCK_T": 32, "BLOCK_E": 128, "num_warps": 8}
    assert moe_router.route_tile(1024, 8192) == {"BLOCK_T": 4, "BLOCK_E": 1024, "num_warps": 8}
