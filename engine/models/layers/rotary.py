"""Rotary position embedding (NeoX layout) and the cos/sin table it reads.

Legend: T = tokens, H = heads, D = head dim (the rotary dim: every model here rotates
the whole head), P = positions in the table.

The table is [P, D] float32: cos of each frequency in the first D/2 columns, sin in
the last D/2, the layout ops.apply_rope expects. Frequencies follow the checkpoint's
`rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling` (older
config.json files): "default", "linear" (position interpolation) and "llama3"
(Llama 3.1's wavelength-dependent scaling).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(hf_config: Any) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling parameters with a "rope_type" key) from a transformers config."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params and "rope_theta" in params:
        theta = params["rope_theta"]
        scaling = dict(params)
    else:
        theta = getattr(hf_config, "rope_theta", 10000.0)
        scaling = dict(getattr(hf_config, "rope_scaling", None) or {})
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    scaling["rope_type"] = rope_type
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
    return float(theta), scaling


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """[D/2] float32 inverse frequencies, after the checkpoint's scaling."""
    # NOTE: same fp32 formula as transformers, so fp32 parity holds to the last bits.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = scaling["rope_type"]
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: keep short wavelengths, divide long ones by `factor`, blend in between."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    original_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    long_wavelen = original_len / low_freq_factor  # beyond this: fully interpolated
    short_wavelen = original_len / high_freq_factor  # below this: untouched
    scaled = torch.where(wavelen > long_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= short_wavelen) & (wavelen <= long_wavelen)
    return torch.where(is_medium, blended, scaled)


def build_cos_sin_cache(head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """[P, D] float32: cos | sin of position * inverse frequency."""
    inv_freq = inverse_frequencies(head_dim, theta, scaling)  # [D/2]
    positions = torch.arange(max_positions, dtype=torch.int64, device="cpu").float()  # [P]
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RotaryEmbedding(nn.Module):
    """Holds the [P, D] cos|sin table that the model's layers share.

    The rotation itself happens inside the KV store: the Llama-family attention hands
    (positions, cos_sin_cache) to PagedAttention, which calls attention_ops.rope_store_kv (one kernel).

    Args:
        head_dim: D.
        max_positions: P, the checkpoint's max_position_embeddings.
        theta, scaling: from `rope_parameters(hf_config)`.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any]) -> None:
        super().__init__()
        # NOTE: computed on the CPU in fp32 whatever the default device and dtype, then moved
        # to the default device; kept fp32 (non-persistent buffer: never in a checkpoint).
        target = torch.empty(0).device
        if target.type == "meta":
            cache = torch.empty(max_positions, head_dim, dtype=torch.float32, device=target)
        else:
            cache = build_cos_sin_cache(head_dim, max_positions, theta, scaling).to(target)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
