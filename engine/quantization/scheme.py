"""What a quantized linear layer holds: the format of its weights and the details of that format.

A scheme fixes the in-memory layout (kernels/quant_formats.py) every quantized linear of a model
allocates; the checkpoint formats (AWQ, GPTQ, compressed-tensors, FP8) and on-the-fly quantization
all end in one of these.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMATS = ("int8", "int4", "nf4", "fp8")
ON_THE_FLY = ("fp8", "int8", "int4", "nf4")  # --quantization's choices
FP8_WEIGHT_SCALES = ("block", "channel")  # per-tensor scales load as per-channel rows (shards differ)
INT4_ON_THE_FLY_GROUPS = (128, 64, 32)  # the first that divides a layer's input width


@dataclass(frozen=True)
class QuantScheme:
    """Args:
    fmt: "int8", "int4", "nf4" or "fp8".
    group_size: int8/int4 scales' group along the input width; None: one scale per output row, or
        on the fly the first of INT4_ON_THE_FLY_GROUPS that divides the layer's width (int4).
    zeros: int4 with zero points (asymmetric); without, the zero point is 8.
    fp8_scales: "block" (128x128 weight scales, activations per 128-wide group) or "channel".
    static_input: fp8 activations scaled by the checkpoint's input_scale instead of per token.
    source: where the weights come from: "on-the-fly" quantizes dense tensors at load; otherwise the
        checkpoint's method (the loader accepts only its packed tensors).
    """

    fmt: str
    group_size: int | None = None
    zeros: bool = False
    fp8_scales: str = "channel"
    static_input: bool = False
    source: str = "on-the-fly"

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"quantization format must be one of {FORMATS}, got {self.fmt!r}")
        if self.fp8_scales not in FP8_WEIGHT_SCALES:
            raise ValueError(f"fp8 weight scales must be one of {FP8_WEIGHT_SCALES}, got {self.fp8_scales!r}")

    @property
    def on_the_fly(self) -> bool:
        return self.source == "on-the-fly"

    def group_for(self, num_in: int) -> int | None:
        """The group size of a layer of input width num_in; None where none fits (on the fly) or it does not
        divide num_in (the caller names the layer)."""
        if self.fmt not in ("int8", "int4"):
            return None
        if self.group_size is not None:
            return self.group_size if num_in % self.group_size == 0 else None
        if self.fmt == "int8":
            return num_in
        return next((g for g in INT4_ON_THE_FLY_GROUPS if num_in % g == 0), None)


def on_the_fly_scheme(name: str) -> QuantScheme:
    """--quantization's scheme: int8 and fp8 per output channel, int4 symmetric in groups of 128 (64 or 32
    where 128 does not divide a layer's width), nf4 in blocks of 64."""
    if name not in ON_THE_FLY:
        raise ValueError(f"quantization must be one of {ON_THE_FLY}, got {name!r}")
    return QuantScheme(fmt=name)
