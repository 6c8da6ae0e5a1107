"""Copying checkpoint tensors into a model's parameters, fused projections included.

Every model's `load_weights` is this function plus the family's name mapping. It
checks what a silent mistake would hide: a tensor with no place in the model, a
shape that does not match, and any parameter (or fused shard) left unloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from engine.models.layers.linear import FusedLinear

# (checkpoint name fragment, fused parameter fragment, shard) for Llama-like models.
LLAMA_STACKED_PARAMS: tuple[tuple[str, str, str], ...] = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", "gate"),
    (".up_proj.", ".gate_up_proj.", "up"),
)


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    stacked_params: tuple[tuple[str, str, str], ...] = (),
    rename: Callable[[str, torch.Tensor], tuple[str, torch.Tensor] | None] | None = None,
) -> None:
    """Copies (checkpoint name, tensor) pairs into `model`'s parameters.

    Args:
        model: the freshly built model (parameters allocated, any device and dtype).
        weights: checkpoint tensors by their checkpoint name.
        stacked_params: how checkpoint projections map onto fused ones.
        rename: maps a checkpoint name (and tensor, e.g. to transpose it) to the model's
            name, or returns None for a tensor the model does not need.

    Raises:
        ValueError: an unknown tensor, a shape mismatch, or parameters left unloaded.
    """
    params = dict(model.named_parameters())
    expected = _expected_keys(model, params)
    loaded: set[tuple[str, str | None]] = set()
    model_name = type(model).__name__
    for checkpoint_name, tensor in weights:
        mapped = rename(checkpoint_name, tensor) if rename else (checkpoint_name, tensor)
        if mapped is None:
            continue
        name, tensor = mapped
        shard = None
        for fragment, fused_fragment, shard_name in stacked_params:
            if fragment in name:
                name, shard = name.replace(fragment, fused_fragment), shard_name
                break
        param = params.get(name)
        if param is None:
            raise ValueError(f"checkpoint tensor {checkpoint_name!r} has no parameter in {model_name}")
        target = param.data
        if shard is not None:
            module = model.get_submodule(name.rsplit(".", 1)[0])
            assert isinstance(module, FusedLinear)
            start, rows = module.shard_rows(shard)
            target = target.narrow(0, start, rows)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint tensor {checkpoint_name!r} has shape {tuple(tensor.shape)}, "
                f"{model_name} expects {tuple(target.shape)} (does config.json match the weights?)"
            )
        target.copy_(tensor)
        loaded.add((name, shard))
    missing = sorted(f"{name}[{shard}]" if shard else name for name, shard in expected - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(f"checkpoint lacks {len(missing)} tensors of {model_name}: {shown}")


def _expected_keys(model: nn.Module, params: dict[str, nn.Parameter]) -> set[tuple[str, str | None]]:
    """Every parameter once, fused ones once per shard."""
    expected: set[tuple[str, str | None]] = set()
    for name in params:
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        if isinstance(module, FusedLinear):
            expected.update((name, shard) for shard in module.shard_sizes)
        else:
            expected.add((name, None))
    return expected
