"""Building blocks shared by every model family: each calls `engine.ops` or a dispatch module beside it
(`attention_ops`, `moe_ops`, `quant_ops`) for its kernel."""

from engine.models.layers.attention import PagedAttention
from engine.models.layers.embedding import LMHead, VocabEmbedding
from engine.models.layers.linear import FusedLinear, Linear, gate_up_linear, qkv_linear
from engine.models.layers.mlp import GatedMLP
from engine.models.layers.norm import LayerNorm, RMSNorm
from engine.models.layers.rotary import RotaryEmbedding

__all__ = [
    "FusedLinear",
    "GatedMLP",
    "LMHead",
    "LayerNorm",
    "Linear",
    "PagedAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "VocabEmbedding",
    "gate_up_linear",
    "qkv_linear",
]
