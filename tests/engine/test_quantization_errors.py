"""Quantized checkpoints and settings the engine refuses at load, each with the tensor, layer, field or
setting named: real checkpoint files written here, altered where the test says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.model_loader import load_model
from tests.engine.checkpoints import build_tiny_checkpoint
from tests.engine.quant_checkpoints import build_quantized_checkpoint

CPU = torch.device("cpu")


def load(model_dir: Path, quantization: str | None = None):
    return load_model(ModelConfig(model=str(model_dir), dtype="float32", quantization=quantization), CPU, torch.float32)


def edit_config(model_dir: Path, **fields) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"].update(fields)
    path.write_text(json.dumps(config))


def edit_tensors(model_dir: Path, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def gptq_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("gptq")
    build_quantized_checkpoint("gptq_int4_asym", directory, smollm2_dir)
    return directory


def copy_of(src: Path, dst: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, dst))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"bits": 3}, "quantization_config.bits: 3 is not supported (4 or 8)"),
        ({"desc_act": True}, "quantization_config.desc_act: True is not supported (false: act-order"),
        ({"quant_method": "bitsandbytes"}, "quantization_config.quant_method: 'bitsandbytes' is not supported"),
        ({"group_size": 48}, "quantization_config.group_size: 48 is not supported (32, 64, 128 or -1"),
        ({"checkpoint_format": "marlin"}, "quantization_config.checkpoint_format: 'marlin' is not supported"),
    ],
    ids=["bits-3", "act-order", "unknown-method", "group-48", "marlin"],
)
def test_unsupported_quantization_config_fails_naming_the_field(gptq_dir, tmp_path, fields, message):
    model_dir = copy_of(gptq_dir, tmp_path / "ckpt")
    edit_config(model_dir, **fields)
    with pytest.raises(ValueError, match=re.escape(message)):
        load(model_dir)


def test_a_scale_of_the_wrong_shape_fails_naming_the_tensor(gptq_dir, tmp_path):
    model_dir = copy_of(gptq_dir, tmp_path / "ckpt")
    name = "model.layers.1.mlp.down_proj.scales"
    edit_tensors(model_dir, lambda t: t.__setitem__(name, t[name][:, :-1].contiguous()))
    with pytest.raises(
        ValueError, match=re.escape(f"checkpoint tensor '{name}' has shape [8, 127], expected [8, 128]")
    ):
        load(model_dir)


def test_act_order_g_idx_fails_naming_the_tensor(gptq_dir, tmp_path):
    model_dir = copy_of(gptq_dir, tmp_path / "ckpt")
    name = "model.layers.0.self_attn.o_proj.g_idx"
    edit_tensors(model_dir, lambda t: t.__setitem__(name, t[name].flip(0).contiguous()))
    with pytest.raises(ValueError, match=re.escape(f"checkpoint tensor '{name}' reorders the input rows (act-order)")):
        load(model_dir)


def test_a_missing_part_fails_naming_it(gptq_dir, tmp_path):
    model_dir = copy_of(gptq_dir, tmp_path / "ckpt")
    name = "model.layers.0.mlp.up_proj.qzeros"
    edit_tensors(model_dir, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=re.escape(f"checkpoint lacks '{name}' of the gptq layer")):
        load(model_dir)


def test_a_group_size_that_does_not_divide_the_input_width_fails_naming_the_layer(smollm2_dir, tmp_path):
    """The tiny Llama's hidden size is 64: AWQ's group of 128 cannot split q|k|v's input rows."""
    model_dir = build_tiny_checkpoint("llama", tmp_path / "ckpt", smollm2_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape(
        "quantization_config (awq): layer model.layers.0.self_attn.qkv_proj: group size 128 does not divide its "
        "input width 64"
    )):  # fmt: skip
        load(model_dir)


def test_a_dense_layer_in_a_quantized_checkpoint_is_refused(smollm2_dir, tmp_path):
    model_dir = build_tiny_checkpoint("llama", tmp_path / "ckpt", smollm2_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"checkpoint tensor 'model\.layers\.0\..*' is a dense torch.float32 weight"):
        load(model_dir)


def test_quantization_setting_errors(gptq_dir, smollm2_dir, tmp_path):
    with pytest.raises(ValueError, match=re.escape("quantization must be one of ('fp8', 'int8', 'int4', 'nf4')")):
        ModelConfig(quantization="int3")
    with pytest.raises(ValueError, match=re.escape("quantization: 'int8' cannot re-quantize a checkpoint")):
        load(gptq_dir, "int8")
    moe_dir = build_tiny_checkpoint("qwen2_moe", tmp_path / "moe", smollm2_dir)
    with pytest.raises(ValueError, match=re.escape("quantization 'int8': quantized MoE experts are not supported")):
        load(moe_dir, "int8")


def _config(raw: dict):
    from types import SimpleNamespace

    return SimpleNamespace(quantization_config=raw)


@pytest.mark.parametrize(
    ("fmt", "edit", "message"),
    [
        ("fp8_block", {"weight_block_size": [64, 64]}, "quantization_config.weight_block_size: [64, 64] is not"),
        ("awq", {"version": "gemv"}, "quantization_config.version: 'gemv' is not supported (gemm)"),
        ("awq", {"zero_point": False}, "quantization_config.zero_point: False is not supported (true)"),
        ("ct_int4_sym", {"ignore": ["lm_head", "model.layers.0.mlp.down_proj"]}, "quantization_config.ignore:"),
        ("ct_int4_sym", {"weights.actorder": "group"}, "config_groups.group_0.weights.actorder: 'group' is not"),
        ("ct_int4_sym", {"weights.num_bits": 2}, "config_groups.group_0.weights.num_bits: 2 is not supported (4 or 8)"),
        ("ct_fp8_channel", {"input_activations": None}, "config_groups.group_0.input_activations: None is not"),
    ],
)
def test_other_unsupported_variants_name_the_field(fmt, edit, message):
    from engine.quantization.checkpoint_config import parse_quantization_config
    from tests.engine.quant_checkpoints import quantization_config

    raw = quantization_config(fmt)
    for key, value in edit.items():
        if key.startswith("weights.") or key == "input_activations":
            group = raw["config_groups"]["group_0"]
            target, field = (group["weights"], key.split(".", 1)[1]) if "." in key else (group, key)
            target[field] = value
        else:
            raw[key] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_quantization_config(_config(raw))


def test_weight_act_order_keeps_groups_in_order_and_loads():
    from engine.quantization.checkpoint_config import parse_quantization_config
    from tests.engine.quant_checkpoints import quantization_config

    raw = quantization_config("ct_int4_asym")
    raw["config_groups"]["group_0"]["weights"]["actorder"] = "weight"
    parsed = parse_quantization_config(_config(raw))
    assert (parsed.scheme.fmt, parsed.scheme.group_size, parsed.scheme.zeros) == ("int4", 32, True)


def test_fp8_on_a_gpu_without_fp8_is_refused_naming_the_setting(monkeypatch):
    """Compute capability 8.0 (A100) has no e4m3 conversions: refused at load, int8 suggested (no silent
    weight-only fallback). The capability query is the only GPU call, answered here as an A100's."""
    from engine.quantization.selection import select_quantization
    from tests.engine.quant_checkpoints import quantization_config

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match=re.escape("quantization 'fp8': fp8 needs a GPU of compute capability 8.9")):
        select_quantization(_config(None), "fp8", cuda)
    with pytest.raises(ValueError, match=re.escape("quantization_config (fp8): fp8 needs a GPU of compute")):
        select_quantization(_config(quantization_config("fp8_block")), None, cuda)
    assert select_quantization(_config(None), "int8", cuda).scheme.fmt == "int8"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert select_quantization(_config(None), "fp8", cuda).scheme.fmt == "fp8"
