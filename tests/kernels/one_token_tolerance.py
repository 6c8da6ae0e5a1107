"""The tolerance of the one-token norm + projection kernels against their fp32 references."""

from __future__ import annotations

import torch


def one_token_tolerance(dtype: torch.dtype, reference: torch.Tensor, num_in: int) -> dict:
    """fp32: sums in another order; 16-bit: one rounding of the output (the interpreter truncates)."""
    scale = max(float(reference.abs().max()), 1.0)
    if dtype == torch.float32:
        return dict(atol=2e-6 * num_in**0.5 * scale, rtol=1e-5)
    return dict(atol=2 * torch.finfo(dtype).eps * scale, rtol=2 * torch.finfo(dtype).eps)
