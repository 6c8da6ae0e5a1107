"""The few-rows projections (kernels/gemv_rows.py) against their fp32 references row by row: 2..8 token rows
(powers of two and not), sizes off the row and column tiles, bias, an fp32 output, the norm with and without a
residual, SwiGLU, a row-strided input; bad input refused; and the engine's dispatch (engine.ops)."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from kernels.gemv_rows import MAX_ROWS, TILES, gemv_rows, gemv_rows_ref, rms_norm_gemv_rows, rms_norm_gemv_rows_ref
from tests.kernels.one_token_tolerance import one_token_tolerance

ON_GPU = torch.cuda.is_available()
EPS = 1e-5
# (N out, K in): a single row pair, sizes off the 4-row and 128-column tiles, K below one tile
SHAPES = [(2, 8), (38, 300), (130, 513)]
if ON_GPU:  # SmolLM2-135M qkv / gate|up / down, Qwen2.5-0.5B qkv
    SHAPES += [(960, 576), (3072, 576), (576, 1536), (1152, 896)]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
ROWS = [2, 3, 5, 8]


def _weights(num_out: int, num_in: int, dtype: torch.dtype, device, bias: bool = True):
    weight = (torch.randn(num_out, num_in, device=device) / num_in**0.5).to(dtype)
    return weight, (torch.randn(num_out, device=device).to(dtype) if bias else None)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.float() if t is not None else None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gemv_rows_matches_linear(shape, rows, dtype, device):
    num_out, num_in = shape
    x = torch.randn(rows, num_in, device=device).to(dtype)
    weight, bias = _weights(num_out, num_in, dtype, device)
    expected = gemv_rows_ref(x.float(), weight.float(), bias.float())
    got = gemv_rows(x, weight, bias)
    assert got.shape == (rows, num_out) and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, **one_token_tolerance(dtype, expected, num_in))


def test_each_row_is_its_own_product(device):
    """Rows differ (one of them zero): a kernel that mixed rows, or read row 0 for every row, fails."""
    x = torch.randn(5, 300, device=device)
    x[3] = 0
    weight, _ = _weights(38, 300, torch.float32, device, bias=False)
    got = gemv_rows(x, weight)
    assert torch.equal(got[3], torch.zeros(38, device=device))
    for row in range(5):
        torch.testing.assert_close(got[row], (weight @ x[row]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp32_output_is_the_rounded_result_widened(dtype, device):
    """out_dtype fp32 (the LM head's logits): the same values as the 16-bit output, widened."""
    x = torch.randn(3, 130, device=device).to(dtype)
    weight, bias = _weights(70, 130, dtype, device)
    narrow = gemv_rows(x, weight, bias)
    wide = gemv_rows(x, weight, bias, out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide, narrow.float())


def test_a_row_strided_input_and_other_tiles(device):
    """x as every other row of a wider buffer (a view's row stride), and tiles a sweep would try."""
    wide = torch.randn(5, 2 * 300, device=device)
    x = wide[:, :300]
    weight, bias = _weights(38, 300, torch.float32, device)
    expected = gemv_rows_ref(x, weight, bias)
    for tiles in ({}, TILES, {"BLOCK_N": 2, "BLOCK_K": 256}, {"BLOCK_N": 8, "BLOCK_K": 64, "num_warps": 2}):
        torch.testing.assert_close(gemv_rows(x, weight, bias, tiles=tiles), expected, atol=1e-5, rtol=1e-5)


def _fp32_norm_reference(x, res, norm_weight, weight, bias, swiglu):
    """The unfused layer in fp32 on the kernel's inputs, with h rounded as the kernel rounds it."""
    h = x if res is None else (x.float() + res.float()).to(x.dtype)
    y, _ = rms_norm_gemv_rows_ref(h.float(), None, norm_weight.float(), EPS, weight.float(), _f32(bias), swiglu=swiglu)
    return y, h


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["nores", "residual"])
@pytest.mark.parametrize("rows", [2, 5, 8])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_gemv_rows_matches_the_unfused_layer(shape, rows, with_residual, swiglu, dtype, device):
    num_out, num_in = shape
    x = torch.randn(rows, num_in, device=device).to(dtype)
    x[1] *= 10  # rows of different scale: a norm shared between rows fails
    res = (3 * torch.randn(rows, num_in, device=device)).to(dtype) if with_residual else None
    norm_weight = (1 + 0.3 * torch.randn(num_in, device=device)).to(dtype)
    weight, bias = _weights(num_out, num_in, dtype, device)
    expected, h = _fp32_norm_reference(x, res, norm_weight, weight, bias, swiglu)
    got, new_residual = rms_norm_gemv_rows(x, res, norm_weight, EPS, weight, bias, swiglu=swiglu)
    assert got.shape == (rows, num_out // 2 if swiglu else num_out) and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, **one_token_tolerance(dtype, expected, num_in))
    if with_residual:
        # the stored residual: x + res rounded once (to nearest on the GPU; the interpreter truncates)
        ulp = 0.0 if ON_GPU or dtype == torch.float32 else torch.finfo(dtype).eps * float(h.float().abs().max())
        assert new_residual is not x
        torch.testing.assert_close(new_residual.float(), h.float(), atol=ulp, rtol=0)
    else:
        assert new_residual is x


def test_rms_norm_gemv_rows_on_a_row_strided_input(device):
    """x and its residual as views of wider buffers: the new residual keeps their row stride; at the
    interpreter's tile and at the GPU's."""
    x = torch.randn(3, 400, device=device)[:, :200]
    res = torch.randn(3, 400, device=device)[:, :200]
    g = 1 + 0.3 * torch.randn(200, device=device)
    weight, _ = _weights(20, 200, torch.float32, device, bias=False)
    expected, _ = rms_norm_gemv_rows_ref(x, res, g, EPS, weight, swiglu=True)
    for tiles in ({}, TILES):  # the interpreter's wide tile and the GPU's (several programs, several K steps)
        got, new_residual = rms_norm_gemv_rows(x, res, g, EPS, weight, swiglu=True, tiles=tiles)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new_residual, x + res, atol=0, rtol=0)


def test_gemv_rows_refuses_what_it_does_not_do(device):
    weight, g = torch.randn(8, 16, device=device), torch.ones(16, device=device)
    with pytest.raises(ValueError, match=f"1 <= M <= {MAX_ROWS}"):
        gemv_rows(torch.randn(MAX_ROWS + 1, 16, device=device), weight)
    with pytest.raises(ValueError, match=f"1 <= M <= {MAX_ROWS}"):
        rms_norm_gemv_rows(torch.randn(MAX_ROWS + 1, 16, device=device), None, g, EPS, weight)
    with pytest.raises(ValueError, match="needs K"):
        gemv_rows(torch.randn(2, 15, device=device), weight)
    with pytest.raises(ValueError, match="weight must be"):
        gemv_rows(torch.randn(2, 16, device=device), weight.double())
    with pytest.raises(ValueError, match="tiles may set only"):
        gemv_rows(torch.randn(2, 16, device=device), weight, tiles={"PREFETCH": 1})
    with pytest.raises(ValueError, match="residual must match"):
        rms_norm_gemv_rows(torch.randn(2, 16, device=device), torch.randn(3, 16, device=device), g, EPS, weight)
    strided = torch.randn(2, 32, device=device)[:, :16]
    with pytest.raises(ValueError, match="residual must have x's strides"):
        rms_norm_gemv_rows(strided, torch.randn(2, 16, device=device), g, EPS, weight)


def test_ops_dispatch_a_few_rows_of_a_small_weight_to_the_kernels(device):
    small = torch.empty(576, 576, device=device)  # SmolLM2-135M's o_proj
    large = torch.empty(ops.GEMV_ROWS_MAX_WEIGHTS // 512 + 1, 512, device=device)
    with ops.kernel_backend("triton"):
        assert ops.uses_gemv_rows(torch.empty(2, 576, device=device), small)
        assert ops.uses_gemv_rows(torch.empty(ops.GEMV_ROWS_MAX, 576, device=device), small)
        assert not ops.uses_gemv_rows(torch.empty(1, 576, device=device), small)  # one token: kernels/gemv.py
        assert not ops.uses_gemv_rows(torch.empty(ops.GEMV_ROWS_MAX + 1, 576, device=device), small)
        assert not ops.uses_gemv_rows(torch.empty(4, 512, device=device), large)  # a large weight's stream: cuBLAS
        head = torch.empty(ops.GEMV_ROWS_MAX_OUT, 32, device=device)  # a tiny model's LM head: one large read
        assert head.numel() <= ops.GEMV_ROWS_MAX_WEIGHTS
        assert not ops.uses_gemv_rows(torch.empty(4, 32, device=device), head)
    with ops.kernel_backend("torch"):
        assert not ops.uses_gemv_rows(torch.empty(2, 576, device=device), small)


@pytest.mark.parametrize("swiglu", [False, True, "separate"], ids=["plain", "swiglu", "swiglu-separate"])
def test_ops_take_the_few_rows_kernels_and_agree_with_the_references(swiglu, device, monkeypatch):
    """engine.ops.linear (fp32 logits too) and rms_norm_linear at GEMV_ROWS_MAX rows through the kernels (SwiGLU
    inside the kernel or, above SWIGLU_GEMV_MAX_FEATURES, as its own kernel after it) and through the torch
    references; a row more takes neither."""
    monkeypatch.setattr(ops, "SWIGLU_GEMV_MAX_FEATURES", 32 if swiglu == "separate" else 4096)
    calls = []
    import kernels.gemv_rows as rows_module

    for name in ("gemv_rows", "rms_norm_gemv_rows"):
        real = getattr(rows_module, name)
        monkeypatch.setattr(
            rows_module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
        )
    g = 1 + 0.3 * torch.randn(96, device=device)
    weight, bias = torch.randn(40, 96, device=device) / 10, torch.randn(40, device=device)
    for rows, expected_calls in ((ops.GEMV_ROWS_MAX, ["gemv_rows", "rms_norm_gemv_rows"]), (ops.GEMV_ROWS_MAX + 1, [])):
        x, res = torch.randn(rows, 96, device=device), torch.randn(rows, 96, device=device)
        outs = {}
        calls.clear()
        for backend in ("triton", "torch"):
            with ops.kernel_backend(backend):
                outs[backend] = (
                    ops.linear(x, weight, bias, out_dtype=torch.float32),
                    *ops.rms_norm_linear(x, res, g, EPS, weight, bias, swiglu=bool(swiglu)),
                )
        assert calls == expected_calls
        for fast, slow in zip(outs["triton"], outs["torch"], strict=True):
            torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)
