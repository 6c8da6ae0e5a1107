"""One linear layer's weights in the in-memory layout of kernels/quant_formats.py, as a checkpoint's
loader hands them to the layer (QuantizedWeight.load), and the shape checks that name the tensor.

Tensors by layout (N = output rows, K = input width, G = group size):
    int8: qweight int8 [N, K], scales fp32 [N, K / G]
    int4: qweight uint8 [N, K / 2], scales fp32 [N, K / G], zeros uint8 [N, K / G] (optional)
    nf4:  qweight uint8 [N, K / 2], absmax fp32 [N, K / 64]
    fp8:  qweight float8_e4m3fn [N, K], weight_scale fp32 [ceil(N/128), ceil(K/128)] (blocks) or [N, 1],
          input_scale fp32 [1, 1] (static activations only)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedTensors:
    """Args:
    name: the checkpoint's name of the layer's weight (`<prefix>.weight`), for messages.
    fmt: "int8", "int4", "nf4" or "fp8".
    tensors: by layout name (above).
    group_size: int8/int4's group along K (K: one per row).
    """

    name: str
    fmt: str
    tensors: dict[str, torch.Tensor]
    group_size: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of the weight these tensors hold."""
        qweight = self.tensors["qweight"]
        per_byte = 2 if self.fmt in ("int4", "nf4") else 1
        return qweight.shape[0], qweight.shape[1] * per_byte


def expect_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], why: str) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"checkpoint tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)} ({why})")


def groups_of(name: str, num_in: int, group_size: int | None, field: str) -> int:
    """The number of groups along K, after checking that the group size divides K."""
    group = num_in if group_size is None else group_size
    if num_in % group:
        raise ValueError(
            f"{field}: group size {group} does not divide the input width {num_in} of checkpoint tensor {name!r}"
        )
    return num_in // group


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words of 32 / bits codes each, the first in the lowest bits, unpacked along dim (0 or 1)
    -> int32 codes (0 .. 2^bits - 1), that dim 32 / bits times longer."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = (1 << bits) - 1
    if dim == 1:
        return ((packed.unsqueeze(-1) >> shifts) & mask).reshape(packed.shape[0], -1)
    codes = (packed.unsqueeze(1) >> shifts.view(1, -1, 1)) & mask  # [R, per_word, C]
    return codes.reshape(packed.shape[0] * per_word, packed.shape[1])


def to_int8_codes(name: str, codes: torch.Tensor, zeros: torch.Tensor, field: str) -> torch.Tensor:
    """Unsigned 8-bit codes with a zero point of 128 everywhere -> int8 codes (q - 128)."""
    if not bool((zeros == 128).all()):
        raise ValueError(f"{field}: checkpoint tensor {name!r} has 8-bit zero points other than 128 (asymmetric)")
    return (codes - 128).to(torch.int8)
