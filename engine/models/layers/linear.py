"""Linear projections, plain and fused.

Legend: T = tokens, I = input features, O = output features.

Weights keep nn.Linear's layout, [O, I]. A fused projection stacks several
checkpoint projections of the same input along O (q|k|v, gate|up) so one matmul
replaces several; the checkpoint's separate tensors are copied into their row
ranges ("shards") at load time.

Inside engine.quantization.model_build.quantized_linears(scheme) a layer holds a QuantizedWeight (`quant`)
instead of its dense weight (`weight` is None), and every part loads into its row range the same way.

Built for a tensor-parallel group (engine/parallel/group.py), a column-parallel projection holds its rank's
rows of O and a row-parallel one its rank's columns of I, summing the partial outputs over the group before
the bias; `checkpoint_slices` says which part of each checkpoint tensor a rank loads.
"""

from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.parallel.group import current as current_tensor_parallel
from engine.quantization.model_build import linear_scheme
from engine.quantization.quantized_weight import QuantizedWeight

PARALLEL_KINDS = (None, "column", "row", "row_partial")


class Linear(nn.Module):
    """y = x W^T + b.

    Args:
        in_features: I.
        out_features: O.
        bias: whether the projection has a bias [O].
        parallel: how a tensor-parallel build splits it: None keeps it whole on every rank; "column" keeps this
            rank's O / N output rows; "row" keeps this rank's I / N input columns and sums the outputs over the
            group; "row_partial" is "row" whose caller sums (several partial outputs, one all-reduce).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, parallel: str | None = None) -> None:
        super().__init__()
        if parallel not in PARALLEL_KINDS:
            raise ValueError(f"parallel must be one of {PARALLEL_KINDS}, got {parallel!r}")
        self.tp = current_tensor_parallel()
        self.parallel = parallel if self.tp.enabled else None
        # parameter name -> (dim, first index, count) of the checkpoint tensor this rank loads
        self.checkpoint_slices: dict[str, tuple[int, int, int]] = {}
        if self.parallel == "column":
            start, out_features = self.tp.split(out_features, f"a column-parallel projection's {out_features} rows")
            self.checkpoint_slices = {"weight": (0, start, out_features), "bias": (0, start, out_features)}
        elif self.parallel is not None:
            start, in_features = self.tp.split(in_features, f"a row-parallel projection's {in_features} columns")
            self.checkpoint_slices = {"weight": (1, start, in_features)}
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
        if self.parallel in ("row", "row_partial"):
            # the partial products of this rank's columns; the bias once, after the sum
            y = self.quant(x) if self.quant is not None else ops.linear(x, self.weight)  # [T, I/N] -> [T, O]
            if self.parallel == "row":
                y = self.tp.all_reduce(y)
            return y if self.bias is None else y + self.bias
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
        shard_sources: (first row, rows) of each shard's checkpoint tensor that this layer holds, for a
            tensor-parallel rank's part (weight and bias alike); None: every shard whole.
    """

    def __init__(
        self, in_features: int, shard_sizes: dict[str, int], bias: bool = False,
        shard_sources: dict[str, tuple[int, int]] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.shard_sizes = dict(shard_sizes)
        self.shard_sources = dict(shard_sources) if shard_sources is not None else None
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
    """q|k|v in one projection: O = (Hq + 2 Hkv) * D; a tensor-parallel rank's heads only (TensorParallel.heads)."""
    tp = current_tensor_parallel()
    heads = tp.heads(num_heads, num_kv_heads)
    q_rows, kv_rows = heads.q * head_dim, heads.kv * head_dim
    sources = None
    if tp.enabled:
        q_from, kv_from = heads.q_start * head_dim, heads.kv_start * head_dim
        sources = {"q": (q_from, q_rows), "k": (kv_from, kv_rows), "v": (kv_from, kv_rows)}
    return FusedLinear(hidden_size, {"q": q_rows, "k": kv_rows, "v": kv_rows}, bias, sources)


def gate_up_linear(hidden_size: int, intermediate_size: int, bias: bool = False) -> FusedLinear:
    """gate|up in one projection: O = 2 I, the layout ops.silu_and_mul expects; a tensor-parallel rank's
    I / N of each."""
    tp = current_tensor_parallel()
    start, rows = tp.split(intermediate_size, "intermediate_size")
    sources = {"gate": (start, rows), "up": (start, rows)} if tp.enabled else None
    return FusedLinear(hidden_size, {"gate": rows, "up": rows}, bias, sources)
