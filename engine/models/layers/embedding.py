"""Token embedding and the output projection (LM head), tied or not.

Legend: T = tokens, S = sequences whose logits are wanted, H = hidden, V = vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops


class VocabEmbedding(nn.Module):
    """Token id -> row of a [V, H] table."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [T] -> [T, H]


class LMHead(nn.Module):
    """Hidden states -> float32 logits, or with widen=False the projection's output in the model's dtype:
    the values float32 logits would widen exactly (the projection rounds to the model's dtype either way),
    for greedy and the sampling kernel, which widen each value themselves, without the cast's kernel or the
    wider rows to read (decision 0006).

    Args:
        vocab_size: V.
        hidden_size: H.
        tied_to: the input embedding whose table doubles as the output projection
            (tie_word_embeddings); None gives the head its own [V, H] weight.
    """

    def __init__(self, vocab_size: int, hidden_size: int, tied_to: VocabEmbedding | None = None) -> None:
        super().__init__()
        if tied_to is not None:
            # NOTE: the same Parameter object, so named_parameters() lists it once (as the
            # embedding) and loading the embedding fills the head too.
            self.weight = tied_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        return ops.linear(hidden, self.weight, out_dtype=torch.float32 if widen else None)  # [S, H] -> [S, V]
