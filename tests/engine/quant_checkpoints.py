"""Tiny checkpoints in the real quantized formats, written by the test itself: a tiny random Llama from
transformers, each linear layer of its decoder quantized and packed as the format's own tools store it
(tensor names, dtypes, packing, zero-point conventions) beside a config.json carrying the format's
quantization_config; and the transformers reference carrying the same weights dequantized (fp32).

Formats (FORMATS): AWQ GEMM int4; GPTQ int4 (symmetric and not) and int8 (zero points stored minus one,
checkpoint_format gptq); compressed-tensors pack-quantized int4 (symmetric and not, in groups) and int8
(per channel); FP8 with 128x128 block scales (quant_method fp8, weight_scale_inv) and compressed-tensors
float-quantized FP8 per channel (dynamic per-token activations) and per tensor (static activations).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tests.engine.checkpoints import SMOLLM2_BOS, SMOLLM2_EOS, SMOLLM2_VOCAB_SIZE, copy_tokenizer, randomize_weights

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FORMATS = (
    "awq", "gptq_int4_sym", "gptq_int4_asym", "gptq_int8", "ct_int4_sym", "ct_int4_asym", "ct_int8",
    "fp8_block", "ct_fp8_channel", "ct_fp8_tensor_static",
)  # fmt: skip
GROUP = 32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def quant_tiny_config() -> Any:
    """128-wide so that FP8's 128-row scale blocks fall on the q|k|v and gate|up boundaries."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=SMOLLM2_VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-5, bos_token_id=SMOLLM2_BOS, eos_token_id=SMOLLM2_EOS, tie_word_embeddings=False,
    )  # fmt: skip


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in 0 .. 2^32 - 1 -> the int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] codes -> int32 [R / (32 / bits), C]: consecutive rows in one word, the first lowest."""
    per = 32 // bits
    grouped = codes.long().view(-1, per, codes.shape[1])
    return _to_int32(sum(grouped[:, i] << (bits * i) for i in range(per)))


def pack_cols(codes: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[R, C] codes -> int32 [R, C / (32 / bits)]: consecutive columns in one word, the i-th word slot
    holding column order[i] of its run."""
    per = 32 // bits
    grouped = codes.long().view(codes.shape[0], -1, per)
    order = order or tuple(range(per))
    return _to_int32(sum(grouped[..., order[i]] << (bits * i) for i in range(per)))


def _asym(w: torch.Tensor, group: int, levels: int, scale_dtype: torch.dtype):
    """Asymmetric codes 0..levels-1: (q [N, K], z [N, K/G], s [N, K/G] rounded to scale_dtype)."""
    g = w.view(w.shape[0], -1, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    s = ((hi - lo) / (levels - 1)).clamp_min(1e-8).to(scale_dtype).float()
    z = torch.round(-lo / s).clamp(0, levels - 1)
    q = (torch.round(g / s[..., None]) + z[..., None]).clamp(0, levels - 1)
    return q.view_as(w).long(), z.long(), s


def _sym(w: torch.Tensor, group: int, qmax: int, scale_dtype: torch.dtype):
    """Symmetric codes -qmax-1..qmax: (q [N, K], s [N, K/G])."""
    g = w.view(w.shape[0], -1, group)
    s = (g.abs().amax(-1) / qmax).clamp_min(1e-8).to(scale_dtype).float()
    q = torch.round(g / s[..., None]).clamp(-qmax - 1, qmax)
    return q.view_as(w).long(), s


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.repeat_interleave(group, dim=1)


def quantize_layer(fmt: str, w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One weight [N, K] -> (the format's tensors by suffix, the dequantized weight fp32)."""
    n, k = w.shape
    if fmt == "awq":
        q, z, s = _asym(w, GROUP, 16, torch.float16)
        tensors = {"qweight": pack_cols(q.t(), 4, AWQ_ORDER), "qzeros": pack_cols(z.t(), 4, AWQ_ORDER),
                   "scales": s.t().half().contiguous()}  # fmt: skip
        return tensors, (q - _expand(z, GROUP)) * _expand(s, GROUP)
    if fmt.startswith("gptq"):
        bits = 8 if fmt == "gptq_int8" else 4
        if fmt == "gptq_int4_asym":
            q, z, s = _asym(w, GROUP, 16, torch.float16)
        else:
            qs, s = _sym(w, GROUP, 2 ** (bits - 1) - 1, torch.float16)
            z = torch.full_like(s, 2 ** (bits - 1)).long()
            q = qs + 2 ** (bits - 1)
        stored_zeros = (z - 1) & ((1 << bits) - 1)  # AutoGPTQ's zero points minus one
        tensors = {"qweight": pack_rows(q.t().contiguous(), bits), "qzeros": pack_cols(stored_zeros.t(), bits),
                   "scales": s.t().half().contiguous(), "g_idx": (torch.arange(k) // GROUP).int()}  # fmt: skip
        return tensors, (q - _expand(z, GROUP)) * _expand(s, GROUP)
    if fmt in ("ct_int4_sym", "ct_int4_asym", "ct_int8"):
        bits, group = (8, k) if fmt == "ct_int8" else (4, GROUP)
        offset = 2 ** (bits - 1)
        if fmt == "ct_int4_asym":
            q, z, s = _asym(w, group, 16, torch.bfloat16)
            q, z = q - offset, z - offset  # compressed-tensors' signed codes and zero points
        else:
            q, s = _sym(w, group, offset - 1, torch.bfloat16)
            z = torch.zeros_like(s).long()
        tensors = {"weight_packed": pack_cols(q + offset, bits), "weight_scale": s.bfloat16(),
                   "weight_shape": torch.tensor([n, k], dtype=torch.int64)}  # fmt: skip
        if fmt == "ct_int4_asym":
            tensors["weight_zero_point"] = pack_rows(z + offset, bits)
        return tensors, (q - _expand(z, group)) * _expand(s, group)
    if fmt == "fp8_block":
        tiles = w.view(n // 128, 128, k // 128, 128)
        scale = tiles.abs().amax(dim=(1, 3)) / 448.0
        q = (tiles / scale[:, None, :, None]).view(n, k).to(torch.float8_e4m3fn)
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return {"weight": q, "weight_scale_inv": scale}, q.float() * full
    scale = w.abs().amax(dim=1, keepdim=True) / 448.0 if fmt == "ct_fp8_channel" else w.abs().amax().view(1) / 448.0
    scale = scale.bfloat16().float()
    q = (w / scale.view(-1, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    tensors = {"weight": q, "weight_scale": scale.bfloat16()}
    if fmt == "ct_fp8_tensor_static":
        tensors["input_scale"] = torch.tensor([0.02], dtype=torch.bfloat16)
    return tensors, q.float() * scale.view(-1, 1)


def quantization_config(fmt: str) -> dict:
    """config.json's quantization_config as each format's tool writes it (the fields the loader reads)."""
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}  # fmt: skip
    if fmt.startswith("gptq"):
        return {"quant_method": "gptq", "bits": 8 if fmt == "gptq_int8" else 4, "group_size": GROUP,
                "desc_act": False, "sym": fmt != "gptq_int4_asym", "checkpoint_format": "gptq"}  # fmt: skip
    if fmt == "fp8_block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if fmt.startswith("ct_fp8"):
        static = fmt == "ct_fp8_tensor_static"
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                   "strategy": "tensor" if static else "channel"}  # fmt: skip
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static,
                "strategy": "tensor" if static else "token"}  # fmt: skip
        group = {"targets": ["Linear"], "weights": weights, "input_activations": acts, "format": "float-quantized"}
        packing = "float-quantized"
    else:
        bits = 8 if fmt == "ct_int8" else 4
        weights = {"num_bits": bits, "type": "int", "symmetric": fmt != "ct_int4_asym", "dynamic": False,
                   "strategy": "channel" if bits == 8 else "group", "group_size": None if bits == 8 else GROUP,
                   "actorder": None}  # fmt: skip
        group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "format": "pack-quantized"}
        packing = "pack-quantized"
    return {"quant_method": "compressed-tensors", "format": packing, "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "quantization_status": "compressed"}  # fmt: skip


def build_quantized_checkpoint(
    fmt: str, out_dir: Path, tokenizer_dir: Path, seed: int = 0, shards: int = 1
) -> dict[str, torch.Tensor]:
    """Writes the `fmt` checkpoint (config.json, safetensors, tokenizer) to out_dir; returns the dequantized
    state dict (fp32, transformers' names) a reference model loads. shards > 1: the tensors dealt round-robin
    into that many files with an index, so every layer's parts straddle files (and arrive out of order)."""
    from transformers import AutoModelForCausalLM

    config = quant_tiny_config()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_weights(model, seed)
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    tensors, dequantized = {}, dict(state)
    for name, w in state.items():
        prefix = name.removesuffix(".weight")
        if prefix.rsplit(".", 1)[-1] in LINEARS and name.endswith(".weight"):
            packed, dequantized[name] = quantize_layer(fmt, w)
            tensors.update({f"{prefix}.{part}": t.contiguous() for part, t in packed.items()})
        else:
            tensors[name] = w
    out_dir.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(tensors, reverse=True)  # reversed: a layer's scales before its codes
        files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        for i, file in enumerate(files):
            save_file({n: tensors[n] for n in names[i::shards]}, str(out_dir / file), metadata={"format": "pt"})
        weight_map = {n: files[j % shards] for j, n in enumerate(names)}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config_dict = config.to_dict()
    config_dict["quantization_config"] = quantization_config(fmt)
    config_dict["architectures"] = ["LlamaForCausalLM"]
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=1))
    copy_tokenizer(tokenizer_dir, out_dir)
    return dequantized


def dequantized_reference(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """transformers' Llama (fp32, eager attention) carrying the dequantized weights."""
    from transformers import AutoModelForCausalLM

    config = quant_tiny_config()
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state)
    return model.eval()
