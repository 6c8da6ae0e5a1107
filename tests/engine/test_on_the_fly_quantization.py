"""Quantization at load (`quantization` int8, int4, nf4): the engine's greedy tokens equal transformers' on the
checkpoint's weights passed through the same quantization and dequantized (fp32, CPU). Qwen2 (biases on q, k,
v: the bias stays dense beside the quantized weight) and GPT-2 (Conv1D weights transposed at load, fused
c_attn) besides the Llama of the perplexity test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.quantization.on_the_fly import quantize_dense
from engine.quantization.scheme import on_the_fly_scheme
from engine.sampling_params import SamplingParams
from kernels.quant_formats import dequantize_int4, dequantize_int8, dequantize_nf4
from tests.engine.checkpoints import build_tiny_checkpoint, load_hf_reference
from tests.engine.engine_helpers import hf_greedy, run_staggered

PROMPT = [1, 504, 3458, 314, 2681, 30]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "c_attn", "c_proj", "c_fc")


def quantized_round_trip(w: torch.Tensor, fmt: str) -> torch.Tensor:
    group = on_the_fly_scheme(fmt).group_for(w.shape[1])
    packed = quantize_dense("w", w, fmt, group).tensors
    if fmt == "int8":
        return dequantize_int8(packed["qweight"], packed["scales"], group)
    if fmt == "int4":
        return dequantize_int4(packed["qweight"], packed["scales"], None, group)
    return dequantize_nf4(packed["qweight"], packed["absmax"])


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
@pytest.mark.parametrize("fmt", ["int8", "int4", "nf4"])
def test_on_the_fly_quantized_model_matches_transformers_on_the_round_tripped_weights(
    kind: str, fmt: str, smollm2_dir: Path, tmp_path: Path
):
    model_dir = build_tiny_checkpoint(kind, tmp_path / kind, smollm2_dir)
    reference = load_hf_reference(model_dir)
    with torch.no_grad():
        for name, module in reference.named_modules():
            if name.rsplit(".", 1)[-1] in LINEARS and name.startswith(("model.layers", "transformer.h")):
                conv1d = kind == "gpt2"  # Conv1D stores [in, out]
                w = module.weight.t() if conv1d else module.weight
                dq = quantized_round_trip(w.contiguous(), fmt)
                module.weight.copy_(dq.t() if conv1d else dq)
    want = hf_greedy(reference, PROMPT, 6)
    quantized = make_engine_with(model_dir, fmt)
    layers = [m for m in quantized.model.modules() if getattr(m, "quant", None) is not None]
    assert layers and all(m.weight is None for m in layers)  # no dense copy beside the quantized one
    got = run_staggered(quantized, [PROMPT], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert got["r0"] == want


def make_engine_with(model_dir: Path, quantization: str):
    from engine.config import CacheConfig, EngineConfig, ModelConfig
    from engine.llm_engine import LLMEngine

    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32", quantization=quantization),
            cache=CacheConfig(block_size=16, num_kv_tokens=256),
            device="cpu",
            kernels="torch",
            async_scheduling=False,
        )
    )
