"""The pre-norm that writes an fp8 projection's activations (kernels/rms_norm_fp8.py) against the unfused
math (norm rounded to x's dtype, then dynamic fp8 quantization), and the fp8 matmul on activations quantized
already (kernels/quant_matmul.py's fp8_matmul_quantized) against its reference and against fp8_matmul."""

from __future__ import annotations

import pytest
import torch

from kernels.quant_formats import random_quantized_weight
from kernels.quant_matmul import (
    fp8_activation_group,
    fp8_matmul,
    fp8_matmul_quantized,
    fp8_matmul_quantized_ref,
    fp8_matmul_ref,
)
from kernels.rms_norm import fused_add_rms_norm_ref
from kernels.rms_norm_fp8 import MAX_COLS, rms_norm_fp8, rms_norm_fp8_ref


def _inputs(num_tokens: int, num_in: int, dtype: torch.dtype, device, residual: bool):
    g = torch.Generator().manual_seed(num_tokens * 31 + num_in)
    # rows of different scale, and one column far larger than the rest (the per-token scale follows it)
    x = torch.randn(num_tokens, num_in, generator=g) * torch.logspace(-1, 1, num_tokens)[:, None]
    x[:, num_in // 3] *= 20
    res = torch.randn(num_tokens, num_in, generator=g) if residual else None
    w = torch.rand(num_in, generator=g) + 0.5
    to = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return to(x), (to(res) if residual else None), w.to(device)


def _same_codes(got, expected, got_scales, expected_scales, group: int | None, share: float = 0.99):
    """Scales within the norm's rounding; at least `share` of the codes equal (a value the other sum order or
    rounding moved across a rounding boundary is one fp8 step off), and every dequantized value within an
    fp8 step of the expected one."""
    torch.testing.assert_close(got_scales, expected_scales, rtol=1e-2, atol=0)
    width = got.shape[1]
    spread = lambda s: s.repeat_interleave(group or width, dim=1)[:, :width]  # noqa: E731
    equal = (got.view(torch.uint8) == expected.view(torch.uint8)).float().mean().item()
    assert equal >= share, f"only {equal:.1%} of the codes equal the expected ones"
    deq, ref = got.float() * spread(got_scales), expected.float() * spread(expected_scales)
    torch.testing.assert_close(deq, ref, rtol=2**-3, atol=float(expected_scales.max()) * 2**-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [None, 128], ids=["per-token", "groups"])
@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
@pytest.mark.parametrize("num_in", [256, 200], ids=["K-pow2", "K-odd"])
def test_the_fused_norm_gives_the_unfused_codes_scales_and_residual(dtype, group, residual, num_in, device):
    """Against the two kernels it replaces (the norm, then the quantization), and against the references.
    NOTE: Triton 3.6's interpreter cuts fp32 to bf16 rather than rounding it, so on the CPU about half the
    bf16 norm outputs (the two kernels' alike) sit one bf16 step from the reference's, and some of their codes
    one fp8 step: against the reference the codes' share is looser there."""
    from kernels.fp8_activations import quantize_fp8_activations
    from kernels.rms_norm import fused_add_rms_norm, rms_norm

    x, res, w = _inputs(3, num_in, dtype, device, residual)
    yq, scales, new_res = rms_norm_fp8(x, res, w, 1e-6, group)
    assert yq.dtype == torch.float8_e4m3fn
    assert scales.shape == (3, 1 if group is None else -(-num_in // group))
    normed, two_res = fused_add_rms_norm(x, res, w, 1e-6) if residual else (rms_norm(x, w, 1e-6), x)
    two_yq, two_scales = quantize_fp8_activations(normed, group)
    _same_codes(yq, two_yq, scales, two_scales, group, share=0.999)
    assert torch.equal(new_res, two_res)
    eyq, escales, eres = rms_norm_fp8_ref(x, res, w, 1e-6, group)
    loose = dtype == torch.bfloat16 and device.type == "cpu"
    _same_codes(yq, eyq, scales, escales, group, share=0.9 if loose else 0.99)
    if residual:  # the sum rounded once to x's dtype, as the unfused layer stores it
        torch.testing.assert_close(new_res, eres, rtol=2**-7 if loose else 0, atol=0)
    else:
        assert new_res is x


def test_a_norm_weight_error_shows(device):
    """A weight applied twice (or not at all) moves most codes: the comparison above would fail."""
    x, res, w = _inputs(2, 256, torch.bfloat16, device, True)
    yq, scales, _ = rms_norm_fp8(x, res, w * w, 1e-6, None)
    eyq, escales, _ = rms_norm_fp8_ref(x, res, w, 1e-6, None)
    with pytest.raises(AssertionError):
        _same_codes(yq, eyq, scales, escales, None)


@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8_block"])
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_the_matmul_on_quantized_activations_matches_fp8_matmul(fmt, num_tokens, device):
    weight = random_quantized_weight(fmt, 160, 256, None, device)
    x, res, w = _inputs(num_tokens, 256, torch.float32, device, True)
    group = fp8_activation_group(weight["qweight"], weight["weight_scale"])
    assert group == (128 if fmt == "fp8_block" else None)
    yq, scales, new_res = rms_norm_fp8(x, res, w, 1e-6, group)
    got = fp8_matmul_quantized(yq, scales, weight["qweight"], weight["weight_scale"], torch.float32)
    expected = fp8_matmul_quantized_ref(yq, scales, weight["qweight"], weight["weight_scale"], torch.float32)
    scale = float(expected.abs().max())
    torch.testing.assert_close(got, expected, atol=1e-5 * scale, rtol=1e-5)
    # the unfused layer: the norm, then fp8_matmul quantizing its output
    normed, _ = fused_add_rms_norm_ref(x, res, w, 1e-6)
    unfused = fp8_matmul(normed, weight["qweight"], weight["weight_scale"])
    torch.testing.assert_close(got, unfused, atol=0.07 * scale, rtol=0.07)
    torch.testing.assert_close(unfused, fp8_matmul_ref(normed, weight["qweight"], weight["weight_scale"]),
                               atol=1e-5 * scale, rtol=1e-5)  # fmt: skip


def test_bad_input_names_the_argument_and_the_limit(device):
    x, res, w = _inputs(2, 256, torch.bfloat16, device, True)
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm_fp8(x, res[:, :128], w, 1e-6)
    with pytest.raises(ValueError, match=f"at most {MAX_COLS}"):
        wide = torch.zeros(1, MAX_COLS + 1, device=device)
        rms_norm_fp8(wide, None, torch.ones(MAX_COLS + 1, device=device), 1e-6)
    with pytest.raises(ValueError, match="group_size must be a power of two"):
        rms_norm_fp8(x, None, w, 1e-6, 96)
    weight = random_quantized_weight("fp8_block", 160, 256, None, device)
    yq, scales, _ = rms_norm_fp8(x, res, w, 1e-6, None)  # per token, where the block weight wants groups
    with pytest.raises(ValueError, match=r"x_scales must be float32 \[2, 2\]"):
        fp8_matmul_quantized(yq, scales, weight["qweight"], weight["weight_scale"], torch.bfloat16)
    with pytest.raises(ValueError, match="xq must be contiguous float8_e4m3fn"):
        fp8_matmul_quantized(x, scales, weight["qweight"], weight["weight_scale"], torch.bfloat16)


def test_a_layer_wider_than_one_program_keeps_the_norm_and_the_quantization_apart(monkeypatch):
    """engine.quantization's QuantizedWeight takes the fused norm only for rows one program holds (MAX_COLS);
    wider fp8 layers keep the two kernels rather than fail."""
    from engine import ops, quant_ops
    from engine.quantization.quantized_weight import QuantizedWeight
    from engine.quantization.scheme import QuantScheme

    scheme = QuantScheme(fmt="fp8")
    narrow, wide = QuantizedWeight(scheme, 256, 16), QuantizedWeight(scheme, 512, 16)
    monkeypatch.setattr(quant_ops, "FP8_NORM_MAX_COLS", 256)
    x = torch.zeros(1, 256)
    with ops.kernel_backend("triton"):
        assert narrow.fuses_norm(x) and not wide.fuses_norm(x)
    with ops.kernel_backend("torch"):
        assert not narrow.fuses_norm(x)
