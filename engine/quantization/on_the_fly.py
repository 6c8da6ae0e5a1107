"""Quantizing a dense weight [N, K] into the in-memory layouts (kernels/quant_formats.py), on its device.

    int8: symmetric, s = amax(|w| of the group) / 127, q = round(w / s) in [-127, 127]
    int4: symmetric, s = amax / 7.5, codes round(w / s) + 8 clamped to [0, 15] (the layout's implied zero
          point 8): the one-sided code -8 is used and +amax clips by half a step (measured on SmolLM2-135M:
          perplexity +21% against +30% with s = amax / 7 and codes [1, 15])
    nf4:  absmax per block of 64, each w / absmax to the nearest NF4_CODEBOOK value
    fp8:  s = amax / 448 per row (or per 128x128 block), q = w / s cast to float8_e4m3fn (round to nearest)
Math: fp32. amax is floored at SCALE_FLOOR so an all-zero group gets codes of 0, not a division by zero.
"""

from __future__ import annotations

import torch

from engine.quantization.packed_tensors import PackedTensors
from kernels.quant_formats import FP8_BLOCK, FP8_MAX, NF4_BLOCK, NF4_CODEBOOK, pack_int4

SCALE_FLOOR = 1e-12


def _grouped_amax(w: torch.Tensor, group: int) -> torch.Tensor:
    """[N, K] -> amax |w| per group along K [N, K / group], floored."""
    return w.view(w.shape[0], -1, group).abs().amax(dim=-1).clamp_min(SCALE_FLOOR)


def quantize_int8(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    scales = _grouped_amax(w, group) / 127.0
    q = torch.round(w / scales.repeat_interleave(group, dim=1)).clamp_(-127, 127).to(torch.int8)
    return {"qweight": q, "scales": scales}


def quantize_int4(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    scales = _grouped_amax(w, group) / 7.5
    codes = torch.round(w / scales.repeat_interleave(group, dim=1)).clamp_(-8, 7) + 8
    return {"qweight": pack_int4(codes), "scales": scales}


def quantize_nf4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    absmax = _grouped_amax(w, NF4_BLOCK)
    normed = w / absmax.repeat_interleave(NF4_BLOCK, dim=1)
    codebook = torch.tensor(NF4_CODEBOOK, dtype=torch.float32, device=w.device)
    # the nearest code: the number of midpoints between neighbouring codes below the value
    codes = torch.bucketize(normed, (codebook[1:] + codebook[:-1]) / 2)
    return {"qweight": pack_int4(codes), "absmax": absmax}


def quantize_fp8(w: torch.Tensor, block: bool) -> dict[str, torch.Tensor]:
    num_out, num_in = w.shape
    if not block:
        scale = w.abs().amax(dim=1, keepdim=True).clamp_min(SCALE_FLOOR) / FP8_MAX
        return {"qweight": (w / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), "weight_scale": scale}
    rows, cols = -(-num_out // FP8_BLOCK), -(-num_in // FP8_BLOCK)
    padded = torch.zeros(rows * FP8_BLOCK, cols * FP8_BLOCK, dtype=w.dtype, device=w.device)
    padded[:num_out, :num_in] = w
    tiles = padded.view(rows, FP8_BLOCK, cols, FP8_BLOCK)
    scale = tiles.abs().amax(dim=(1, 3)).clamp_min(SCALE_FLOOR) / FP8_MAX  # [rows, cols]
    q = (tiles / scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).view_as(padded)[:num_out, :num_in]
    return {"qweight": q.to(torch.float8_e4m3fn).contiguous(), "weight_scale": scale}


def quantize_dense(name: str, w: torch.Tensor, fmt: str, group: int | None, fp8_block: bool = False) -> PackedTensors:
    """A dense [N, K] weight (any float dtype, any device) -> its PackedTensors, computed on w's device."""
    w = w.float().contiguous()
    if fmt == "int8":
        return PackedTensors(name, fmt, quantize_int8(w, group), group)
    if fmt == "int4":
        return PackedTensors(name, fmt, quantize_int4(w, group), group)
    if fmt == "nf4":
        return PackedTensors(name, fmt, quantize_nf4(w))
    return PackedTensors(name, fmt, quantize_fp8(w, fp8_block))
