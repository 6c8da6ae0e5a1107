"""The weights of one quantized linear layer, held by engine/models/layers/linear.py's Linear in place
of its dense weight, and their matmul through engine.quant_ops.

Legend: N = output rows (all fused parts together), K = input width, G = group size.
Buffers (kernels/quant_formats.py's layouts, allocated on the device the model is built on):
    int8: qweight [N, K] int8, scales [N, K / G]
    int4: qweight [N, K / 2] uint8, scales [N, K / G], zeros [N, K / G] (asymmetric schemes)
    nf4:  qweight [N, K / 2] uint8, absmax [N, K / 64]
    fp8:  qweight [N, K] float8_e4m3fn, weight_scale [ceil(N / 128), ceil(K / 128)] or [N, 1],
          input_scale [1, 1] (static activations: the largest of the fused parts' scales)
A fused projection (q|k|v, gate|up) loads each part into its rows; every layout is row-major in N, so a
part is a row range of every buffer (of 128-row blocks for block-scaled fp8).
"""

from __future__ import annotations

import torch
from torch import nn

from engine import quant_ops
from engine.quantization.on_the_fly import quantize_dense
from engine.quantization.packed_tensors import PackedTensors
from engine.quantization.scheme import QuantScheme
from kernels.quant_formats import FP8_BLOCK, INT4_SYMMETRIC_ZERO, NF4_BLOCK


def _blocks(n: int) -> int:
    return -(-n // FP8_BLOCK)


class QuantizedWeight(nn.Module):
    """Args: scheme (the model's), num_in K, num_out N.

    A layer the scheme cannot hold (a group size that does not divide K) allocates nothing and keeps the
    reason in `problem`; engine/quantization/model_build.py names the layer in the error.
    """

    def __init__(self, scheme: QuantScheme, num_in: int, num_out: int) -> None:
        super().__init__()
        self.scheme = scheme
        self.fmt = scheme.fmt
        self.num_in = num_in
        self.num_out = num_out
        self.group_size = scheme.group_for(num_in)
        self.problem = self._problem()
        if self.problem is None:
            for name, (shape, dtype) in self._layout().items():
                self.register_buffer(name, torch.zeros(shape, dtype=dtype), persistent=False)

    def _problem(self) -> str | None:
        if self.fmt in ("int8", "int4") and self.group_size is None:
            if self.scheme.group_size is None:  # on the fly: none of the int4 groups fits
                return f"no int4 group of 128, 64 or 32 divides its input width {self.num_in}"
            return f"group size {self.scheme.group_size} does not divide its input width {self.num_in}"
        if self.fmt == "nf4" and self.num_in % NF4_BLOCK:
            return f"nf4 needs an input width that is a multiple of {NF4_BLOCK}, got {self.num_in}"
        if self.fmt == "int4" and self.num_in % 2:
            return f"int4 needs an even input width, got {self.num_in}"
        return None

    def _layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        n, k, f32 = self.num_out, self.num_in, torch.float32
        if self.fmt == "int8":
            return {"qweight": ((n, k), torch.int8), "scales": ((n, k // self.group_size), f32)}
        if self.fmt == "int4":
            layout = {"qweight": ((n, k // 2), torch.uint8), "scales": ((n, k // self.group_size), f32)}
            if self.scheme.zeros:
                layout["zeros"] = ((n, k // self.group_size), torch.uint8)
            return layout
        if self.fmt == "nf4":
            return {"qweight": ((n, k // 2), torch.uint8), "absmax": ((n, k // NF4_BLOCK), f32)}
        scale = (_blocks(n), _blocks(k)) if self.scheme.fp8_scales == "block" else (n, 1)
        layout = {"qweight": ((n, k), torch.float8_e4m3fn), "weight_scale": (scale, f32)}
        if self.scheme.static_input:
            layout["input_scale"] = ((1, 1), f32)
        return layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N] in x's dtype."""
        if self.fmt == "int8":
            return quant_ops.int8_linear(x, self.qweight, self.scales, self.group_size)
        if self.fmt == "int4":
            return quant_ops.int4_linear(x, self.qweight, self.scales, getattr(self, "zeros", None), self.group_size)
        if self.fmt == "nf4":
            return quant_ops.nf4_linear(x, self.qweight, self.absmax)
        return quant_ops.fp8_linear(x, self.qweight, self.weight_scale, getattr(self, "input_scale", None))

    def fuses_norm(self, x: torch.Tensor) -> bool:
        """Whether the pre-norm before this projection writes its activations (norm_project): fp8 with dynamic
        activation scales, on the kernels' backend, a row that one program holds (kernels/rms_norm_fp8.py)."""
        return self.fmt == "fp8" and not self.scheme.static_input and quant_ops.fuses_fp8_norm(x, self.num_in)

    def norm_project(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(rms_norm(x + residual)), x + residual) where fuses_norm(x): the norm quantizes its output."""
        return quant_ops.fp8_norm_linear(x, residual, norm_weight, eps, self.qweight, self.weight_scale)

    @torch.no_grad()
    def load(self, name: str, tensor: torch.Tensor | PackedTensors, start: int, rows: int) -> None:
        """Rows start .. start + rows (one fused part, or all) from a checkpoint tensor `name`: PackedTensors
        of a quantized checkpoint, or a dense [rows, K] weight to quantize on the fly (on this device)."""
        if not isinstance(tensor, PackedTensors):
            if not self.scheme.on_the_fly:
                raise ValueError(
                    f"checkpoint tensor {name!r} is a dense {tensor.dtype} weight, but quantization_config "
                    f"({self.scheme.source}) quantizes every linear layer but the LM head"
                )
            if tuple(tensor.shape) != (rows, self.num_in):
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the layer expects {(rows, self.num_in)}"
                )
            tensor = quantize_dense(name, tensor.to(self.qweight.device), self.fmt, self.group_size)
        self._store(name, tensor, start, rows)

    def _store(self, name: str, packed: PackedTensors, start: int, rows: int) -> None:
        if packed.fmt != self.fmt:
            raise ValueError(
                f"checkpoint tensor {name!r} holds {packed.fmt} weights, the model's layers are {self.fmt}"
            )
        if packed.shape != (rows, self.num_in):
            raise ValueError(
                f"checkpoint tensor {name!r} is a [N, K] = {list(packed.shape)} weight, the layer expects "
                f"{[rows, self.num_in]} (does config.json match the weights?)"
            )
        if self.fmt in ("int8", "int4") and packed.group_size != self.group_size:
            raise ValueError(
                f"checkpoint tensor {name!r} has groups of {packed.group_size}, the layer {self.group_size}"
            )
        tensors = dict(packed.tensors)
        if self.fmt == "int4" and self.scheme.zeros and "zeros" not in tensors:
            tensors["zeros"] = torch.full_like(tensors["scales"], INT4_SYMMETRIC_ZERO, dtype=torch.uint8)
        unexpected = sorted(set(tensors) - set(self._layout()))
        if unexpected:
            raise ValueError(
                f"checkpoint tensor {name!r} brings {unexpected}, which the model's {self.fmt} layers lack"
            )
        for key, value in tensors.items():
            target = getattr(self, key)
            if key == "input_scale":  # one scale for every fused part: the largest never clips
                target.copy_(torch.maximum(target, value.to(target.device)))
                continue
            if key == "weight_scale" and self.scheme.fp8_scales == "block":
                if start % FP8_BLOCK:
                    raise ValueError(
                        f"checkpoint tensor {name!r} starts at row {start} of a fused projection, not on a "
                        f"{FP8_BLOCK}-row block of its weight_block_size"
                    )
                target = target.narrow(0, start // FP8_BLOCK, _blocks(rows))
            else:
                target = target.narrow(0, start, rows)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r}: its {key} is {list(value.shape)}, the layer expects "
                    f"{list(target.shape)}"
                )
            target.copy_(value)

    @torch.no_grad()
    def fill_random(self, generator: torch.Generator) -> None:
        """Dummy weights: N(0, 1 / K) quantized, whatever the scheme's source."""
        dense = torch.empty(self.num_out, self.num_in, device=self.qweight.device)
        dense.normal_(0.0, self.num_in**-0.5, generator=generator)
        packed = quantize_dense("dummy", dense, self.fmt, self.group_size, self.scheme.fp8_scales == "block")
        if "input_scale" in self._layout():
            packed.tensors["input_scale"] = torch.full((1, 1), 4.0 / 448.0, device=dense.device)
        self._store("dummy", packed, 0, self.num_out)
