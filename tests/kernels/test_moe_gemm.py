"""The expert GEMMs: grouped (kernels/moe_gemm.py) and one-token (kernels/moe_gemv.py) against their torch
references, and the whole routed-experts op (kernels/fused_moe.py) on both paths against the expert-by-expert
reference, over odd widths (no dim a multiple of a tile), odd expert counts, top-k 1 / 2 / 4 / 8 and 1-40
tokens; and the tile choice (kernels/moe_tiles.py)."""

from __future__ import annotations

import pytest
import torch

from kernels.fused_moe import fused_experts, fused_experts_ref
from kernels.moe_align import moe_align, moe_align_ref
from kernels.moe_gemm import moe_gemm_down, moe_gemm_gate_up, moe_gemm_ref
from kernels.moe_gemv import TILE_KEYS as GEMV_KERNEL_TILE_KEYS
from kernels.moe_gemv import moe_gemv_down, moe_gemv_gate_up, moe_gemv_ref
from kernels.moe_router import moe_route_ref
from kernels.moe_tiles import (
    GEMV_TILE_KEYS,
    SHARED_MEMORY_BUDGET,
    choose_tiles,
    device_config_file,
    heuristic_grouped_tile,
    moe_shape_key,
    shared_bytes,
)

# bf16 and fp16 products are exact in fp32; the tolerance covers the outputs' roundings
DTYPES = [
    pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="fp32"),
    pytest.param(torch.bfloat16, dict(atol=2e-2, rtol=2e-2), id="bf16"),
    pytest.param(torch.float16, dict(atol=2e-3, rtol=2e-3), id="fp16"),
]
SMALL_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 1}


def moe_inputs(num_tokens, num_experts, top_k, hidden, inter, dtype, device, seed=0):
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I] at unit output scale, and a softmax top-k routing."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=generator)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=generator) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=generator) * inter**-0.5
    weights, ids = moe_route_ref(torch.randn(num_tokens, num_experts, generator=generator), top_k, True)
    on = [t.to(dtype).to(device) for t in (x, w13, w2)]
    return (*on, weights.to(device), ids.to(device))


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,hidden,inter,tile",
    [
        (1, 3, 1, 24, 20, {}),
        (9, 5, 2, 40, 36, {"GROUP_M": 3}),
        (23, 7, 4, 33, 18, {"BLOCK_M": 32, "BLOCK_K": 32}),
        (6, 9, 8, 48, 24, {"BLOCK_N": 32}),
    ],
)
def test_grouped_gemms_match_the_reference(num_tokens, num_experts, top_k, hidden, inter, tile, dtype, tol, device):
    x, w13, w2, weights, ids = moe_inputs(num_tokens, num_experts, top_k, hidden, inter, dtype, device)
    tiles = {**SMALL_TILE, **tile}
    aligned = moe_align(ids, num_experts, tiles["BLOCK_M"])
    num_pairs = ids.numel()
    act = moe_gemm_gate_up(x, w13, ids, *aligned, tiles)
    torch.testing.assert_close(act, moe_gemm_ref(x, w13, *aligned, num_pairs, top_k, True), **tol)
    out = moe_gemm_down(act, w2, weights, *aligned, tiles)
    torch.testing.assert_close(out, moe_gemm_ref(act, w2, *aligned, num_pairs, 1, False, weights), **tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,inter", [(1, 5, 2, 40, 36), (3, 11, 8, 33, 20)])
@pytest.mark.parametrize("tile", [{}, {"UNROLL": False, "BLOCK_N": 2}], ids=["unrolled", "loop"])
def test_one_token_gemvs_match_the_reference(num_tokens, num_experts, top_k, hidden, inter, tile, dtype, tol, device):
    x, w13, w2, weights, ids = moe_inputs(num_tokens, num_experts, top_k, hidden, inter, dtype, device, seed=1)
    expected_act, expected = moe_gemv_ref(x, w13, w2, weights, ids)
    act = moe_gemv_gate_up(x, w13, ids, tile)
    torch.testing.assert_close(act, expected_act, **tol)
    torch.testing.assert_close(moe_gemv_down(act, w2, weights, ids, tile), expected, **tol)


# the one-token path at the few tokens it serves, the grouped one up to 40 tokens (the interpreter's cost
# is the programs' count: P x I / 4 for the one-token gate|up)
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,hidden,inter,path",
    [
        (1, 1, 1, 24, 20, "gemv"), (1, 1, 1, 24, 20, "grouped"),
        (2, 8, 2, 40, 28, "gemv"), (2, 8, 2, 40, 28, "grouped"),
        (5, 13, 4, 20, 12, "gemv"), (5, 13, 4, 20, 12, "grouped"),
        (4, 9, 8, 32, 16, "gemv"), (40, 9, 8, 32, 16, "grouped"),
        (17, 7, 4, 40, 24, "grouped"), (31, 60, 4, 24, 12, "grouped"),
    ],
)  # fmt: skip
def test_fused_experts_match_the_expert_by_expert_reference(num_tokens, num_experts, top_k, hidden, inter, path,
                                                             device):  # fmt: skip
    x, w13, w2, weights, ids = moe_inputs(num_tokens, num_experts, top_k, hidden, inter, torch.float32, device)
    got = fused_experts(x, w13, w2, weights, ids, tiles={"path": path})
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


def test_fused_experts_in_bf16_stay_within_its_roundings(device):
    x, w13, w2, weights, ids = moe_inputs(11, 6, 4, 40, 24, torch.bfloat16, device, seed=2)
    reference = fused_experts_ref(x, w13, w2, weights, ids)
    for path in ("gemv", "grouped"):
        got = fused_experts(x, w13, w2, weights, ids, tiles={"path": path})
        torch.testing.assert_close(got, reference, atol=3e-2, rtol=3e-2)


def test_a_token_routed_to_one_expert_k_times_is_summed_k_times(device):
    """Duplicate ids in a row (not top-k's output, but a valid input) still add each slot's share."""
    x, w13, w2, _, _ = moe_inputs(2, 3, 2, 24, 20, torch.float32, device)
    ids = torch.tensor([[1, 1], [2, 0]], dtype=torch.int32, device=device)
    weights = torch.tensor([[0.25, 0.5], [0.5, 0.5]], device=device)
    expected = fused_experts_ref(x, w13, w2, weights, ids)
    for path in ("gemv", "grouped"):
        torch.testing.assert_close(fused_experts(x, w13, w2, weights, ids, tiles={"path": path}), expected)


def test_shapes_are_checked_before_any_launch(device):
    x, w13, w2, weights, ids = moe_inputs(3, 4, 2, 24, 20, torch.float32, device)
    with pytest.raises(ValueError, match="expert weights do not fit"):
        fused_experts(x, w13, w2[:, :, :10], weights, ids)
    with pytest.raises(ValueError, match="ids must be int32"):
        fused_experts(x, w13, w2, weights, ids.long())
    with pytest.raises(ValueError, match=r"top-k \(5\) must be at most the number of experts \(4\)"):
        fused_experts(x, w13, w2, weights.repeat(1, 3)[:, :5], ids.repeat(1, 3)[:, :5])
    with pytest.raises(ValueError, match="align with the GEMM's BLOCK_M"):
        moe_gemm_gate_up(x, w13, ids, *moe_align_ref(ids, 4, 32), SMALL_TILE)


def test_the_tile_chooser_knows_the_one_token_kernels_tile_keys():
    assert GEMV_TILE_KEYS == GEMV_KERNEL_TILE_KEYS


def test_tuned_entries_choose_path_and_nearest_tile_and_the_heuristic_fills_in():
    tuned_small, tuned_large = dict(SMALL_TILE, BLOCK_N=32), dict(SMALL_TILE, BLOCK_M=64)
    gate_up_tile = {"BLOCK_N": 8, "BLOCK_K": 256, "UNROLL": False, "num_warps": 4}
    gemv = {"gemv_gate_up": gate_up_tile, "gemv_down": None}  # a kernel the sweep did not reach: the default's
    entry = {"small_batch_max_tokens": 3, "grouped": {"8": tuned_small, "256": tuned_large},
             "gemv": {"gate_up": gate_up_tile}}  # fmt: skip
    assert choose_tiles(entry, 3, 128, 8) == {**choose_tiles({}, 3, 128, 8), **gemv}  # 3 <= 8 untuned too
    assert choose_tiles(entry, 3, 128, 8)["path"] == "gemv"
    assert choose_tiles(entry, 4, 128, 8) == {"path": "grouped", **tuned_small, **gemv}
    untuned_gemv = {"gemv_gate_up": None, "gemv_down": None}
    assert choose_tiles(entry, 40, 128, 8) == {**choose_tiles({}, 40, 128, 8), **gemv}  # 5x from 8, 6x from 256
    assert choose_tiles({}, 40, 128, 8)["gemv_gate_up"] is None and choose_tiles({}, 40, 128, 8)["gemv_down"] is None
    assert choose_tiles(entry, 200, 128, 8) == {"path": "grouped", **tuned_large, **gemv}
    assert choose_tiles(entry, 513, 128, 8) == {**choose_tiles({}, 513, 128, 8), **gemv}  # over 2x from 256
    assert choose_tiles({}, 3, 128, 8, {"gemv_down": gate_up_tile}) == {**choose_tiles({}, 3, 128, 8), **untuned_gemv,
                                                                         "gemv_down": gate_up_tile}  # fmt: skip
    assert choose_tiles({}, 8, 128, 8)["path"] == "gemv"  # 128 // (2 * 8)
    assert choose_tiles({}, 9, 128, 8)["path"] == "grouped"
    assert choose_tiles({}, 3, 8, 2, {"path": "gemv"})["path"] == "gemv"
    with pytest.raises(ValueError, match="may set only"):
        choose_tiles({}, 3, 8, 2, {"BLOCK_X": 3})
    with pytest.raises(ValueError, match="lacks"):
        choose_tiles({"grouped": {"16": {"BLOCK_M": 16}}}, 30, 8, 2)
    # a file from another version of the one-token kernels fails at the first call, naming what to do
    with pytest.raises(ValueError, match=r"gemv.down = \{'PREFETCH': True\} \(retune"):
        choose_tiles({"gemv": {"down": {"PREFETCH": True}}}, 1, 8, 2)
    with pytest.raises(ValueError, match="gemv.gate"):
        choose_tiles({"gemv": {"gate": {}}}, 1, 8, 2)
    assert [heuristic_grouped_tile(t, 128, 8)["BLOCK_M"] for t in (16, 512, 1536, 8192)] == [16, 32, 64, 128]
    # every heuristic tile fits the shared-memory budget, float32's by narrower columns and fewer stages
    for element_bytes in (2, 4):
        for tokens in (16, 512, 1536, 8192):
            tile = heuristic_grouped_tile(tokens, 128, 8, element_bytes)
            assert shared_bytes(tile, element_bytes) <= SHARED_MEMORY_BUDGET, (element_bytes, tile)
    assert heuristic_grouped_tile(8192, 128, 8) == {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
                                                    "num_warps": 8, "num_stages": 3}  # fmt: skip
    wide_fp32 = heuristic_grouped_tile(8192, 128, 8, 4)
    assert (wide_fp32["BLOCK_N"], wide_fp32["num_stages"]) == (64, 2)  # fewer registers, fewer stages
    assert moe_shape_key(128, 8, 2048, 768, torch.bfloat16) == "E=128,K=8,H=2048,I=768,dtype=bfloat16"
    assert device_config_file("NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.json"
