"""The one-token qkv projection with its pre-norm, RoPE and KV store in one kernel, against the unfused
pair (rms_norm_gemv_ref, then rope_store_kv_ref) in fp32 on the same rounded inputs: every row of qkv
(q rotated, k and v as projected), the whole pool (the token's slot written, nothing else), the new
residual; head dims whose halves the 4-row tile does not divide, K across the column tiles, GQA, bias,
a skipped slot (-1), bad input refused."""

from __future__ import annotations

import pytest
import torch

from kernels.rms_norm_qkv_rope import (
    TILES,
    WIDE_TILES,
    qkv_rope_block_n,
    qkv_rope_tiles,
    rms_norm_qkv_rope,
    rms_norm_qkv_rope_ref,
)
from tests.kernels.one_token_tolerance import one_token_tolerance

ON_GPU = torch.cuda.is_available()
EPS = 1e-5
MAX_POSITIONS = 64
# (K, Hq, Hkv, D): D / 2 divisible by the 4-row tile, by 2 only (D 12), by nothing (D 10); K below,
# across and past the 512-column chunks; GQA 1, 3, 4
CASES = [(40, 2, 2, 8), (300, 3, 1, 12), (513, 4, 1, 10), (1100, 8, 2, 16)]
if ON_GPU:  # Llama-3.2-1B and Llama-3.1-8B at one token
    CASES += [(2048, 32, 8, 64), (4096, 32, 8, 128)]
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]


def _inputs(case, dtype, device, *, residual: bool, bias: bool, slot: int):
    num_in, num_q, num_kv, head_dim = case
    rows = (num_q + 2 * num_kv) * head_dim
    x = torch.randn(1, num_in, device=device).to(dtype)
    res = (3 * torch.randn(1, num_in, device=device)).to(dtype) if residual else None
    norm_weight = (1 + 0.3 * torch.randn(num_in, device=device)).to(dtype)
    weight = (torch.randn(rows, num_in, device=device) / num_in**0.5).to(dtype)
    b = torch.randn(rows, device=device).to(dtype) if bias else None
    angles = torch.rand(MAX_POSITIONS, head_dim // 2, device=device) * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)  # [P, D] fp32
    positions = torch.tensor([37], device=device)
    pool = torch.randn(2, 5, 4, num_kv, head_dim, device=device).to(dtype)  # 5 blocks of 4 slots
    slots = torch.tensor([slot], device=device)
    return x, res, norm_weight, weight, b, positions, cos_sin, pool, slots


# both tiles the launcher picks from (qkv_rope_tiles), whatever the device's SM count
TILE_CHOICES = [pytest.param(TILES, id="tile"), pytest.param(WIDE_TILES, id="wide")]


@pytest.mark.parametrize("tile", TILE_CHOICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual,with_bias", [(False, False), (True, True)], ids=["plain", "residual+bias"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_the_unfused_pair(case, with_residual, with_bias, dtype, tile, device):
    num_in, num_q, num_kv, head_dim = case
    x, res, g, weight, bias, positions, cos_sin, pool, slots = _inputs(
        case, dtype, device, residual=with_residual, bias=with_bias, slot=13
    )
    # the reference in fp32, on h rounded as the kernel rounds it
    h = x if res is None else (x.float() + res.float()).to(dtype)
    as32 = lambda t: t.float() if t is not None else None  # noqa: E731
    pool32, before = pool.float(), pool.clone()
    expected, _ = rms_norm_qkv_rope_ref(h.float(), None, g.float(), EPS, weight.float(), as32(bias), positions,
                                        cos_sin, pool32[0], pool32[1], slots, num_q)  # fmt: skip
    got, new_residual = rms_norm_qkv_rope(x, res, g, EPS, weight, bias, positions, cos_sin, pool[0], pool[1],
                                          slots, num_q, tiles=tile)  # fmt: skip
    tol = one_token_tolerance(dtype, expected, num_in)
    torch.testing.assert_close(got.float(), expected, **tol)
    torch.testing.assert_close(pool.float(), pool32, **tol)
    assert not torch.equal(pool[:, 3, 1], before[:, 3, 1])  # slot 13 = block 3, offset 1: written
    if with_residual:
        assert new_residual is not x
        ulp = 0.0 if ON_GPU or dtype == torch.float32 else torch.finfo(dtype).eps * float(h.float().abs().max())
        torch.testing.assert_close(new_residual.float(), h.float(), atol=ulp, rtol=0)
    else:
        assert new_residual is x


def test_a_skipped_slot_writes_nothing_into_the_pool(device):
    x, res, g, weight, bias, positions, cos_sin, pool, slots = _inputs(
        (300, 3, 1, 12), torch.float32, device, residual=True, bias=False, slot=-1
    )
    before = pool.clone()
    got, _ = rms_norm_qkv_rope(x, res, g, EPS, weight, bias, positions, cos_sin, pool[0], pool[1], slots, 3)
    assert torch.equal(pool, before)
    expected, _ = rms_norm_qkv_rope_ref(x, res, g, EPS, weight, bias, positions, cos_sin, before[0], before[1],
                                        slots, 3)  # fmt: skip
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)


def test_the_wide_tile_is_taken_only_where_programs_are_few():
    """kernels/gemv.py's rule: at most 4 programs an SM of an H100 (132 SMs) take the wide tile."""
    assert qkv_rope_tiles(32 + 2 * 8, 64, 132) == WIDE_TILES  # Llama-3.2-1B: 384 programs
    assert qkv_rope_tiles(32 + 2 * 8, 128, 132) == TILES  # Llama-3.1-8B: 768 programs
    assert qkv_rope_tiles(14 + 2 * 2, 64, 132) == WIDE_TILES  # Qwen2-0.5B: 144 programs
    assert qkv_rope_tiles(32 + 2 * 8, 64, 0) == TILES  # the interpreter (no SMs)


def test_the_tile_is_halved_until_it_divides_half_the_head():
    assert qkv_rope_block_n(128) == 4 and qkv_rope_block_n(64) == 4
    assert qkv_rope_block_n(12) == 2 and qkv_rope_block_n(10) == 1
    assert qkv_rope_block_n(128, {"BLOCK_N": 16}) == 16


def test_refuses_what_it_does_not_do(device):
    x, res, g, weight, bias, positions, cos_sin, pool, slots = _inputs(
        (40, 2, 2, 8), torch.float32, device, residual=False, bias=False, slot=0
    )
    with pytest.raises(ValueError, match="rows"):
        rms_norm_qkv_rope(x, res, g, EPS, weight[:-8], bias, positions, cos_sin, pool[0], pool[1], slots, 2)
    with pytest.raises(ValueError, match="single token"):
        rms_norm_qkv_rope(x.expand(2, -1), res, g, EPS, weight, bias, positions, cos_sin, pool[0], pool[1], slots, 2)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rms_norm_qkv_rope(x, res, g, EPS, weight, bias, positions, cos_sin[:, :4], pool[0], pool[1], slots, 2)
    with pytest.raises(ValueError, match="slot_mapping"):
        rms_norm_qkv_rope(x, res, g, EPS, weight, bias, positions, cos_sin, pool[0], pool[1], slots.repeat(2), 2)
    with pytest.raises(ValueError, match="tiles"):
        rms_norm_qkv_rope(x, res, g, EPS, weight, bias, positions, cos_sin, pool[0], pool[1], slots, 2,
                          tiles={"BLOCK_M": 4})  # fmt: skip
