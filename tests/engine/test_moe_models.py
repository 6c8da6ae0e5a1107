"""MoE checkpoints: both expert layouts and shards load onto the same packed parameters, the config
chooses the sparse layers as transformers does, and a checkpoint whose MoE fields or expert tensors are
wrong fails at load naming the field or the tensor.

(Logits and greedy tokens against transformers: test_model_parity.py, test_engine_parity.py and
test_moe_engine.py, which run every kind of checkpoints.MOE_ARCHITECTURES.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.model_loader import load_model
from engine.models.layers.moe_block import SparseMoeBlock
from engine.weights.errors import CheckpointError
from tests.engine.checkpoints import MOE_ARCHITECTURES, build_tiny_checkpoint, load_hf_reference, tiny_config
from tests.engine.model_harness import PagedHarness

CPU = torch.device("cpu")
PROMPT = list(range(300, 337))


def load(model_dir: Path) -> torch.nn.Module:
    return load_model(ModelConfig(model=str(model_dir)), CPU, torch.float32).model


def edited_checkpoint(source: Path, target: Path, config: dict | None = None, drop: str | None = None) -> Path:
    """A copy of `source` with config.json fields replaced (None values deleted) and one tensor dropped."""
    target.mkdir()
    for path in source.iterdir():
        target.joinpath(path.name).write_bytes(path.read_bytes())
    if config:
        fields = json.loads((target / "config.json").read_text())
        for key, value in config.items():
            if value is None:
                fields.pop(key, None)
            else:
                fields[key] = value
        (target / "config.json").write_text(json.dumps(fields))
    if drop:
        tensors = load_file(str(target / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


@pytest.mark.parametrize("kind", MOE_ARCHITECTURES)
def test_packed_and_sharded_layouts_load_the_hub_layouts_weights(
    kind: str, tiny_checkpoint: Callable[[str], Path], smollm2_dir: Path, tmp_path: Path
) -> None:
    hub_dir = tiny_checkpoint(kind)
    packed_dir = build_tiny_checkpoint(kind, tmp_path / "packed", smollm2_dir, expert_layout="packed")
    sharded_dir = build_tiny_checkpoint(kind, tmp_path / "sharded", smollm2_dir, max_shard_size="300KB")
    hub_names = set(load_file(str(hub_dir / "model.safetensors")))
    packed_names = set(load_file(str(packed_dir / "model.safetensors")))
    assert any(".experts.0." in n for n in hub_names) and not any(".experts.gate_up_proj" in n for n in hub_names)
    assert any(n.endswith(".experts.gate_up_proj") for n in packed_names) and not any(
        ".experts.0." in n for n in packed_names
    )
    assert len(list(sharded_dir.glob("*.safetensors"))) > 1

    hub = load(hub_dir)
    hub_params = dict(hub.named_parameters())
    for other in (load(packed_dir), load(sharded_dir)):
        other_params = dict(other.named_parameters())
        assert other_params.keys() == hub_params.keys()
        for name, param in hub_params.items():
            assert torch.equal(param, other_params[name]), name
    # the packed checkpoint as transformers reads it: the same model
    expected = load_hf_reference(packed_dir)(torch.tensor([PROMPT])).logits[0]
    got = PagedHarness(hub).step({"s": PROMPT})["s"]
    assert (got - expected).abs().max().item() < 1e-4


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers() -> None:
    from transformers import AutoModelForCausalLM

    from engine.models.qwen2_moe import Qwen2MoeForCausalLM

    fields = tiny_config("qwen2_moe").to_dict()
    fields.update(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3], layer_types=None)
    config = type(tiny_config("qwen2_moe"))(**fields)
    with torch.device("meta"):
        ours = Qwen2MoeForCausalLM(config)
        theirs = AutoModelForCausalLM.from_config(config)
    ours_sparse = [i for i, layer in enumerate(ours.model.layers) if isinstance(layer.mlp, SparseMoeBlock)]
    theirs_sparse = [i for i, layer in enumerate(theirs.model.layers) if hasattr(layer.mlp, "experts")]
    assert ours_sparse == theirs_sparse == [1, 5]
    assert ours.model.layers[0].mlp.gate_up_proj.weight.shape == (2 * config.intermediate_size, config.hidden_size)


# ---- bad checkpoints fail at load, naming the field or the tensor ------------------------------


@pytest.mark.parametrize(
    "kind,fields,message",
    [
        # a config.json whose model_type's config class has no experts at all
        ("qwen3_moe", {"model_type": "qwen3", "num_experts": None}, "config.json lacks num_experts"),
        ("qwen3_moe", {"num_experts_per_tok": 12}, r"num_experts_per_tok \(12\) must be at most num_experts \(11\)"),
        ("mixtral", {"num_local_experts": 0}, "num_local_experts must be >= 1"),
        ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step must be >= 1"),
        ("qwen3_moe", {"mlp_only_layers": [1, 3]}, r"mlp_only_layers names layers \[3\] outside \[0, 3\)"),
        # fewer experts in config.json than in the checkpoint
        ("olmoe", {"num_experts": 8}, "belongs to expert 8, but config.json gives 8 experts"),
        ("qwen2_moe", {"moe_intermediate_size": 16}, r"experts\.0\.down_proj\.weight' has shape \(64, 32\)"),
    ],
)
def test_inconsistent_moe_fields_are_named(
    kind: str, fields: dict, message: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    model_dir = edited_checkpoint(tiny_checkpoint(kind), tmp_path / "bad", config=fields)
    with pytest.raises(ValueError, match=message):
        load(model_dir)


def test_a_null_moe_field_is_named(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    fields = json.loads((tiny_checkpoint("mixtral") / "config.json").read_text())
    fields["num_experts_per_tok"] = None  # kept as null, not deleted
    model_dir = edited_checkpoint(tiny_checkpoint("mixtral"), tmp_path / "bad")
    (model_dir / "config.json").write_text(json.dumps(fields))
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        load(model_dir)


@pytest.mark.parametrize(
    "kind,tensor",
    [
        ("mixtral", "model.layers.1.block_sparse_moe.experts.3.w1.weight"),
        ("qwen2_moe", "model.layers.0.mlp.experts.6.down_proj.weight"),
        ("qwen3_moe", "model.layers.2.mlp.experts.10.up_proj.weight"),
        ("qwen2_moe", "model.layers.1.mlp.shared_expert_gate.weight"),
        ("olmoe", "model.layers.0.mlp.gate.weight"),
    ],
)
def test_a_missing_expert_tensor_is_named(
    kind: str, tensor: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    model_dir = edited_checkpoint(tiny_checkpoint(kind), tmp_path / "bad", drop=tensor)
    with pytest.raises(ValueError, match=rf"checkpoint lacks 1 tensors of \w+: {tensor.replace('.', '[.]')}$"):
        load(model_dir)


def test_a_missing_packed_tensor_is_named(smollm2_dir: Path, tmp_path: Path) -> None:
    packed_dir = build_tiny_checkpoint("mixtral", tmp_path / "packed", smollm2_dir, expert_layout="packed")
    model_dir = edited_checkpoint(packed_dir, tmp_path / "bad", drop="model.layers.0.mlp.experts.down_proj")
    missing = r"lacks 8 tensors .*model\.layers\.0\.block_sparse_moe\.experts\.0\.w2\.weight"
    with pytest.raises(ValueError, match=missing):
        load(model_dir)


def test_an_unknown_expert_projection_is_named(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    model_dir = edited_checkpoint(tiny_checkpoint("mixtral"), tmp_path / "bad")
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["model.layers.0.block_sparse_moe.experts.2.w4.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"experts\.2\.w4\.weight' is no expert projection .*'w1', 'w2', 'w3'"):
        load(model_dir)


def test_dense_checkpoint_names_stay_unknown_in_a_moe_model(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    """A dense MLP's tensor in a sparse layer has no place there: named, not silently dropped."""
    model_dir = edited_checkpoint(tiny_checkpoint("olmoe"), tmp_path / "bad")
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 32)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight' has no parameter"):
        load(model_dir)


def test_dummy_expert_weights_scale_by_their_input_width(tiny_checkpoint: Callable[[str], Path]) -> None:
    """[E, out, in] expert weights get N(0, 1 / in) as [out, in] matrices do: unit-scale outputs per expert."""
    model = load_model(ModelConfig(model=str(tiny_checkpoint("mixtral")), load_format="dummy"), CPU,
                       torch.float32).model  # fmt: skip
    experts = model.model.layers[0].mlp.experts
    hidden, inter = experts.gate_up_proj.shape[2], experts.down_proj.shape[2]
    assert hidden != 2 * inter and hidden != inter  # the widths that tell the two fan-ins apart
    assert experts.gate_up_proj.std().item() == pytest.approx(hidden**-0.5, rel=0.05)
    assert experts.down_proj.std().item() == pytest.approx(inter**-0.5, rel=0.05)
