"""Linear projections, plain and fused.

Legend: T = tokens, I = input features, O = output features.

Weights keep nn.Linear's layout, [O, I]. A fused projection stacks several
checkpoint projections of the same input along O (q|k|v, gate|up) so one matmul
replaces several; the checkpoint's separate tensors are copied into their row
ranges ("shards") at load time.

Inside engine.quantization.model_build.quantized_linears(scheme) a layer holds a QuantizedWeight (`quant`)
instead of its dense weight (`weight` is None), and every part loads into its row range the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.quantization.model_build import linear_scheme
from engine.quantization.quantized_weight import QuantizedWeight


class Linear(nn.Module):
    """y = x W^T + b.

    Args:
        in_features: I.
        out_features: O.
        bias: whether the projection has a bias [O].
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        scheme = linear_scheme()
        self.quant = QuantizedWeight(scheme, in_features, out_features) if scheme is not None else None
        if self.quant is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        else:
            self.register_parameter("weight", None)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            y = self.quant(x)  # [T, I] -> [T, O]
            return y if self.bias is None else y + self.bias
        return ops.linear(x, self.weight, self.bias)  # [T, I] -> [T, O]


class FusedLinear(Linear):
    """Several projections of one input stacked along the output dimension.

    Args:
        in_features: I.
        shard_sizes: output rows of each stacked projection, in order, by shard name
            (e.g. {"q": 512, "k": 128, "v": 128}).
        bias: whether the projections have biases (all or none, as in every checkpoint we load).
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.shard_sizes = dict(shard_sizes)
        self.shard_offsets: dict[str, int] = {}
        offset = 0
        for name, size in shard_sizes.items():
            self.shard_offsets[name] = offset
            offset += size

    def shard_rows(self, shard: str) -> tuple[int, int]:
        """(first row, number of rows) of one stacked projection, for weight and bias alike."""
        return self.shard_offsets[shard], self.shard_sizes[shard]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[T, O] -> one view per shard, [T, O_shard] each (views, not copies)."""
        return y.split(list(self.shard_sizes.values()), dim=-1)


def qkv_linear(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool = False) -> FusedLinear:
    """q|k|v in one projection: O = (Hq + 2 Hkv) * D."""
    return FusedLinear(
        hidden_size,
        {"q": num_heads * head_dim, "k": num_kv_heads * head_dim, "v": num_kv_heads * head_dim},
        bias,
    )


def gate_up_linear(hidden_size: int, intermediate_size: int, bias: bool = False) -> FusedLinear:
    """gate|up in one projection: O = 2 I, the layout ops.silu_and_mul expects."""
    return FusedLinear(hidden_size, {"gate": intermediate_size, "up": intermediate_size}, bias)
