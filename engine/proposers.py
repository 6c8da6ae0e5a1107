"""Proposers of speculative decoding: each guesses the next tokens of the sequences that speculate in a step.

A proposer only guesses; verification (engine/spec_verify.py) keeps exactly the tokens the target model
itself chooses, so a bad guess costs time, never correctness. The interface takes the requests (their
tokens so far) and a budget of tokens per request: a prompt-lookup proposer reads the tokens alone, a
draft model or an EAGLE-style head would also run a forward of its own here (the latter reading the
target's hidden states, which `propose` would then take as well).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.request import Request


class Proposer(Protocol):
    def propose(self, requests: list[Request], budgets: list[int]) -> list[list[int]]:
        """Up to budgets[i] guessed tokens to follow requests[i]'s tokens (an empty list: no guess)."""
        ...


class NgramProposer:
    """Prompt lookup: the sequence's newest n tokens (n from ngram_max down to ngram_min) are looked for
    earlier in its prompt and output; at the latest earlier match, the tokens that followed it there
    are the guess. Copy-heavy text (code edits, quoting, summaries of the prompt) repeats long runs.

    Args:
        ngram_max, ngram_min: the longest and shortest suffix matched (the longest match wins).
    """

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def propose(self, requests: list[Request], budgets: list[int]) -> list[list[int]]:
        return [self._one(r.all_token_ids, k) if k > 0 else [] for r, k in zip(requests, budgets, strict=True)]

    def _one(self, tokens: list[int], k: int) -> list[int]:
        length = len(tokens)
        if length < self.ngram_min + 1:
            return []
        array = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            suffix = array[length - n :]
            # windows starting at 0 .. length - n - 1: every occurrence but the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(array[: length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the latest match: the most recent context
                return tokens[start : start + k]
        return []


def make_proposer(method: str, ngram_max: int, ngram_min: int) -> Proposer:
    """The proposer of SpeculativeConfig.method that needs no model (the engine builds a draft model's:
    engine/draft_proposer.py)."""
    if method == "ngram":
        return NgramProposer(ngram_max, ngram_min)
    raise ValueError(f"speculative method {method!r} needs a proposer built by the engine")
