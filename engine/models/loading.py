"""Copying checkpoint tensors into a model's parameters, fused projections included.

Every model's `load_weights` is this function plus the family's name mapping. It
checks what a silent mistake would hide: a tensor with no place in the model, a
shape that does not match, and any parameter (or fused shard) left unloaded.

MoE experts load in either layout onto the packed parameters of a FusedMoE
(engine/models/layers/fused_moe.py): the Hub's per-expert tensors
(`<...>.experts.{e}.<projection>.weight`) each into their expert's slice, or the packed
`<...>.experts.gate_up_proj` / `down_proj` of transformers 5 whole.

On a tensor-parallel rank each tensor is cut to the rank's part before the shape check (`_rank_part`: a
layer's `checkpoint_slices`, a fused projection's `shard_sources`, an expert block's `rank_part`).

A quantized Linear (engine/quantization) has no `weight` parameter: its `<...>.weight` tensor (a dense one
to quantize on the fly, or a quantized checkpoint's regrouped PackedTensors) loads into its QuantizedWeight,
into the fused part's rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

from engine.models.layers.fused_moe import FusedMoE
from engine.models.layers.linear import FusedLinear, Linear

# (checkpoint name fragment, fused parameter fragment, shard) for Llama-like models.
LLAMA_STACKED_PARAMS: tuple[tuple[str, str, str], ...] = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", "gate"),
    (".up_proj.", ".gate_up_proj.", "up"),
)
# one expert's projection in a per-expert checkpoint: <module>.experts.<e>.<projection>.weight
EXPERT_TENSOR = re.compile(r"^(?P<module>.+\.experts)\.(?P<expert>\d+)\.(?P<projection>\w+)\.weight$")
Shard = str | tuple[int, str] | None  # a fused projection's shard name, an expert slice (expert, part), or whole


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    stacked_params: tuple[tuple[str, str, str], ...] = (),
    rename: Callable[[str, torch.Tensor], tuple[str, torch.Tensor] | None] | None = None,
    checkpoint_label: Callable[[str], str] | None = None,
) -> None:
    """Copies (checkpoint name, tensor) pairs into `model`'s parameters.

    Args:
        model: the freshly built model (parameters allocated, any device and dtype).
        weights: checkpoint tensors by their checkpoint name.
        stacked_params: how checkpoint projections map onto fused ones.
        rename: maps a checkpoint name (and tensor, e.g. to transpose it) to the model's
            name, or returns None for a tensor the model does not need.
        checkpoint_label: maps a model-side name back to the checkpoint's, for the message
            about missing expert tensors (the inverse of `rename` where it renames modules).

    Raises:
        ValueError: an unknown tensor, a shape mismatch, or parameters left unloaded.
    """
    params = dict(model.named_parameters())
    expected = _expected_keys(model, params)
    loaded: set[tuple[str, Shard]] = set()
    model_name = type(model).__name__
    for checkpoint_name, tensor in weights:
        mapped = rename(checkpoint_name, tensor) if rename else (checkpoint_name, tensor)
        if mapped is None:
            continue
        name, tensor = mapped
        quantized = _quantized_target(model, name, stacked_params)
        if quantized is not None:
            name, shard, linear = quantized
            start, rows = linear.shard_rows(shard) if shard is not None else (0, linear.out_features)
            linear.quant.load(checkpoint_name, _rank_part(linear, "weight", shard, tensor), start, rows)
            loaded.add((name, shard))
            continue
        expert_slice = _expert_slice(model, name, checkpoint_name)
        if expert_slice is not None:
            name, shard, target = expert_slice
        else:
            name, shard, target = _stacked_target(model, params, name, checkpoint_name, stacked_params)
        tensor = _rank_part(_owner(model, name), name.rsplit(".", 1)[-1], shard, tensor)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint tensor {checkpoint_name!r} has shape {tuple(tensor.shape)}, "
                f"{model_name} expects {tuple(target.shape)} (does config.json match the weights?)"
            )
        target.copy_(tensor)
        loaded.add((name, shard))
        module = _owner(model, name)
        if shard is None and isinstance(module, FusedMoE):  # a packed tensor fills every expert's slice
            loaded.update((name, s) for s in module.shards(name.rsplit(".", 1)[1]))
    missing = sorted(_label(model, name, shard, checkpoint_label) for name, shard in expected - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(f"checkpoint lacks {len(missing)} tensors of {model_name}: {shown}")


def _rank_part(module: nn.Module, param: str, shard: Shard, tensor: torch.Tensor) -> torch.Tensor:
    """The part of a checkpoint tensor a tensor-parallel rank holds in `module`'s parameter `param` (`shard`:
    a fused projection's shard, or an expert slice (expert, part)); the tensor itself without tensor
    parallelism or for a replicated parameter."""
    if isinstance(module, FusedMoE):
        return module.rank_part(shard[1] if isinstance(shard, tuple) else None, param, tensor)
    if isinstance(module, FusedLinear) and module.shard_sources is not None and isinstance(shard, str):
        start, rows = module.shard_sources[shard]
        return tensor.narrow(0, start, rows)
    part = getattr(module, "checkpoint_slices", {}).get(param)
    if part is None:
        return tensor
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{param} of {type(module).__name__}: tensor parallelism loads dense tensors only")
    dim, start, count = part
    return tensor.narrow(dim, start, count)


def _quantized_target(
    model: nn.Module, name: str, stacked_params: tuple[tuple[str, str, str], ...]
) -> tuple[str, Shard, Linear] | None:
    """(weight name, shard, layer) where `name` is the weight of a quantized Linear; None otherwise."""
    if not name.endswith(".weight"):
        return None
    shard = None
    for fragment, fused_fragment, shard_name in stacked_params:
        if fragment in name:
            name, shard = name.replace(fragment, fused_fragment), shard_name
            break
    try:
        module = model.get_submodule(name.removesuffix(".weight"))
    except AttributeError:
        return None
    if not isinstance(module, Linear) or module.quant is None:
        return None
    return name, shard, module


def _stacked_target(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    name: str,
    checkpoint_name: str,
    stacked_params: tuple[tuple[str, str, str], ...],
) -> tuple[str, Shard, torch.Tensor]:
    """(parameter name, shard, the tensor to copy into) of a plain or fused-projection tensor."""
    shard = None
    for fragment, fused_fragment, shard_name in stacked_params:
        if fragment in name:
            name, shard = name.replace(fragment, fused_fragment), shard_name
            break
    param = params.get(name)
    if param is None:
        raise ValueError(f"checkpoint tensor {checkpoint_name!r} has no parameter in {type(model).__name__}")
    target = param.data
    if shard is not None:
        module = _owner(model, name)
        assert isinstance(module, FusedLinear)
        start, rows = module.shard_rows(shard)
        target = target.narrow(0, start, rows)
    return name, shard, target


def _expert_slice(model: nn.Module, name: str, checkpoint_name: str) -> tuple[str, Shard, torch.Tensor] | None:
    """(packed parameter name, (expert, part), the expert's slice) of a per-expert tensor; None for others."""
    match = EXPERT_TENSOR.match(name)
    if match is None:
        return None
    try:
        module = model.get_submodule(match["module"])
    except AttributeError:
        return None
    if not isinstance(module, FusedMoE):
        return None
    part = module.checkpoint_names.get(match["projection"])
    if part is None:
        raise ValueError(
            f"checkpoint tensor {checkpoint_name!r} is no expert projection {type(model).__name__} knows "
            f"(expected one of {sorted(module.checkpoint_names)})"
        )
    expert = int(match["expert"])
    if expert >= module.num_experts:
        raise ValueError(
            f"checkpoint tensor {checkpoint_name!r} belongs to expert {expert}, but config.json gives "
            f"{module.num_experts} experts (does config.json match the weights?)"
        )
    return f"{match['module']}.{module.param_of(part)}", (expert, part), module.expert_weight(part, expert)


def _owner(model: nn.Module, param_name: str) -> nn.Module:
    return model.get_submodule(param_name.rsplit(".", 1)[0]) if "." in param_name else model


def _label(model: nn.Module, name: str, shard: Shard, checkpoint_label: Callable[[str], str] | None) -> str:
    """How the message about a missing tensor names it: an expert slice by its per-expert checkpoint name."""
    if isinstance(shard, tuple):
        module = _owner(model, name)
        assert isinstance(module, FusedMoE)
        label = module.checkpoint_tensor(name.rsplit(".", 1)[0], *shard)
        return checkpoint_label(label) if checkpoint_label else label
    return f"{name}[{shard}]" if shard else name


def _expected_keys(model: nn.Module, params: dict[str, nn.Parameter]) -> set[tuple[str, Shard]]:
    """Every parameter once, fused ones once per shard, packed experts once per expert slice."""
    expected: set[tuple[str, Shard]] = set()
    for module_name, module in model.named_modules():
        if isinstance(module, Linear) and module.quant is not None:
            shards = list(module.shard_sizes) if isinstance(module, FusedLinear) else [None]
            expected.update((f"{module_name}.weight", shard) for shard in shards)
    for name in params:
        module = _owner(model, name)
        if isinstance(module, FusedLinear):
            expected.update((name, shard) for shard in module.shard_sizes)
        elif isinstance(module, FusedMoE):
            expected.update((name, shard) for shard in module.shards(name.rsplit(".", 1)[1]))
        else:
            expected.add((name, None))
    return expected
