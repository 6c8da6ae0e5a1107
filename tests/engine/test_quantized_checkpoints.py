"""Quantized checkpoints in their real on-disk formats (tests/engine/quant_checkpoints.py writes them),
served by the engine on CPU (fp32, the kernels' torch references):

- weight-only formats (AWQ, GPTQ int4 sym/asym and int8, compressed-tensors pack-quantized int4 sym/asym
  and int8): greedy tokens equal transformers' on the same weights dequantized;
- FP8 (block-scaled `quant_method: fp8`, compressed-tensors per channel dynamic and per tensor static):
  greedy tokens equal a torch reference of the same math, transformers' model on the dequantized weights
  with each projection's input quantized to e4m3 as the format says (per 128-wide group, per token, or by
  the static input_scale) by hooks written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import hf_greedy, make_engine, run_staggered
from tests.engine.quant_checkpoints import (
    FORMATS,
    LINEARS,
    build_quantized_checkpoint,
    dequantized_reference,
)

PROMPTS = [[1, 504, 3458, 314, 2681, 30, 1074, 253], [1, 7103, 284, 19122]]
NEW_TOKENS = 8
WEIGHT_ONLY = [f for f in FORMATS if "fp8" not in f]
FP8 = [f for f in FORMATS if "fp8" in f]


def fake_quantize_inputs(model: torch.nn.Module, fmt: str) -> None:
    """Each decoder projection's input x -> e4m3(x / s) * s, s = amax / 448 over the format's activation
    group (the same math the engine's fp8 matmul does, written independently here)."""

    def quantize(module, args):
        (x,) = args
        if fmt == "ct_fp8_tensor_static":
            scale = torch.tensor(0.02, dtype=torch.bfloat16).float()
            return ((x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale,)
        group = 128 if fmt == "fp8_block" else x.shape[-1]
        g = x.reshape(*x.shape[:-1], -1, group)
        scale = g.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0
        q = torch.div(g, scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
        return (q.reshape(x.shape),)

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LINEARS:
            module.register_forward_pre_hook(quantize)


@pytest.mark.parametrize("fmt", WEIGHT_ONLY + FP8)
def test_quantized_checkpoint_greedy_tokens_match_the_reference(fmt: str, smollm2_dir: Path, tmp_path: Path):
    state = build_quantized_checkpoint(fmt, tmp_path / fmt, smollm2_dir)
    reference = dequantized_reference(state)
    if fmt in FP8:
        fake_quantize_inputs(reference, fmt)
    want = [hf_greedy(reference, prompt, NEW_TOKENS) for prompt in PROMPTS]
    engine = make_engine(tmp_path / fmt, num_kv_tokens=512)
    layer = engine.model.model.layers[0].mlp.gate_up_proj
    assert layer.weight is None and layer.quant is not None  # the layer holds the packed weight, not a dense one
    got = run_staggered(engine, PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [got[f"r{i}"] for i in range(len(PROMPTS))] == want


@pytest.mark.parametrize("fmt", ["gptq_int4_sym", "ct_int4_asym", "fp8_block"])
def test_a_sharded_checkpoint_with_parts_across_files_loads_the_same(fmt: str, smollm2_dir: Path, tmp_path: Path):
    """Every layer's parts dealt over three safetensors files (scales before codes, g_idx after its layer)."""
    state = build_quantized_checkpoint(fmt, tmp_path / fmt, smollm2_dir, shards=3)
    reference = dequantized_reference(state)
    if fmt in FP8:
        fake_quantize_inputs(reference, fmt)
    got = run_staggered(
        make_engine(tmp_path / fmt, num_kv_tokens=256), PROMPTS[:1],
        SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True),
    )  # fmt: skip
    assert got["r0"] == hf_greedy(reference, PROMPTS[0], NEW_TOKENS)


def test_repacked_weights_equal_the_checkpoints_dequantized_weights(smollm2_dir: Path, tmp_path: Path):
    """The repacking itself, bit for bit: each layer's layout dequantizes to the checkpoint's weight (AWQ's
    interleaved nibbles, GPTQ's minus-one zero points)."""
    from kernels.quant_formats import dequantize_int4

    for fmt in ("awq", "gptq_int4_asym"):
        state = build_quantized_checkpoint(fmt, tmp_path / fmt, smollm2_dir)
        quant = make_engine(tmp_path / fmt, num_kv_tokens=256).model.model.layers[1].self_attn.qkv_proj.quant
        got = dequantize_int4(quant.qweight, quant.scales, quant.zeros, quant.group_size)
        want = torch.cat([state[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["awq", "fp8_block", "ct_fp8_channel"])
def test_the_triton_quantized_gemm_serves_the_same_tokens_on_the_interpreter(
    fmt: str, smollm2_dir: Path, tmp_path: Path, monkeypatch
):
    """engine.quant_ops' dispatch: kernels="triton" runs kernels/quant_matmul.py's kernels (Triton's CPU
    interpreter here: the one-token GEMV of the decode steps, the GEMM's tiles of the prompt) and serves the
    tokens of the torch references. fp8 too: its activations are quantized again at every layer, so any
    difference in a layer's output that moves a code shows in the tokens (on the GPU the fp8 tensor-core dot's
    own accumulation order does: decision 0070). fp8's pre-norms write the activations themselves
    (kernels/rms_norm_fp8.py, decision 0072): two a layer a step."""
    import kernels.rms_norm_fp8 as rms_norm_fp8

    fused_norms = []
    real = rms_norm_fp8.rms_norm_fp8
    monkeypatch.setattr(rms_norm_fp8, "rms_norm_fp8", lambda *a: fused_norms.append(a[0].shape[0]) or real(*a))
    build_quantized_checkpoint(fmt, tmp_path / fmt, smollm2_dir)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    want = run_staggered(make_engine(tmp_path / fmt, num_kv_tokens=256), PROMPTS[:1], params)
    assert fused_norms == []  # the torch references' engine runs the norm and the quantization apart
    engine = make_engine(tmp_path / fmt, num_kv_tokens=256, kernels="triton")
    fused_norms.clear()  # the warm-up's
    got = run_staggered(engine, PROMPTS[:1], params)
    assert got == want
    layers = len(engine.model.model.layers)
    assert len(fused_norms) == (2 * layers * 3 if fmt.startswith(("fp8", "ct_fp8")) else 0)


def test_dense_projections_take_the_streaming_gemm_when_switched_on(monkeypatch):
    """engine.ops.DENSE_STREAMING_MAX_TOKENS routes 2..N-token dense projections to the streaming GEMM (the
    Triton interpreter here); one token and longer steps keep their paths."""
    from engine import ops
    from kernels.quant_matmul import dense_matmul_ref

    calls = []
    import kernels.quant_matmul as quant_matmul

    real = quant_matmul.dense_matmul
    monkeypatch.setattr(quant_matmul, "dense_matmul", lambda x, w: calls.append(x.shape[0]) or real(x, w))
    monkeypatch.setattr(ops, "DENSE_STREAMING_MAX_TOKENS", 8)
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(32, 64, generator=generator), torch.randn(32, generator=generator)
    with ops.kernel_backend("triton"):
        for tokens in (1, 4, 9):
            x = torch.randn(tokens, 64, generator=generator)
            torch.testing.assert_close(ops.linear(x, weight, bias), dense_matmul_ref(x, weight) + bias)
    assert calls == [4]
