"""Token embedding and the output projection (LM head), tied or not.

Legend: T = tokens, S = sequences whose logits are wanted, H = hidden, V = vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.parallel.group import current as current_tensor_parallel


class VocabEmbedding(nn.Module):
    """Token id -> row of a [V, H] table.

    Args:
        vocab_size: V.
        hidden_size: H.
        vocab_parallel: on a tensor-parallel rank, hold only this rank's V / N rows: a token outside them
            looks up zeros, and the sum over the group gives every rank its row (a table shared with the LM
            head stays whole: the head is replicated, decision 0061).
    """

    def __init__(self, vocab_size: int, hidden_size: int, vocab_parallel: bool = False) -> None:
        super().__init__()
        self.tp = current_tensor_parallel()
        self.vocab_start, rows = 0, vocab_size
        # parameter name -> (dim, first index, count) of the checkpoint tensor this rank loads
        self.checkpoint_slices: dict[str, tuple[int, int, int]] = {}
        self.vocab_parallel = vocab_parallel and self.tp.enabled
        if self.vocab_parallel:
            self.vocab_start, rows = self.tp.split(vocab_size, "vocab_size")
            self.checkpoint_slices = {"weight": (0, self.vocab_start, rows)}
        self.weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.vocab_parallel:
            return F.embedding(input_ids, self.weight)  # [T] -> [T, H]
        local = input_ids - self.vocab_start  # [T]
        mine = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)  # [T, H]
        return self.tp.all_reduce(rows * mine.unsqueeze(1).to(rows.dtype))


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
