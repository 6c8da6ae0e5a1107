"""Proposers with known acceptance for speculative-decoding tests: they propose a reference run's own
tokens, with chosen positions wrong, so verification meets long accepted runs, rejections at every
offset, and proposals cut by max_tokens."""

from __future__ import annotations

from engine.config import SpeculativeConfig
from engine.llm_engine import LLMEngine
from engine.request import Request


class ReferenceProposer:
    """Proposes the tokens a non-speculative run emitted for the same request id after the request's current
    output, each one replaced by a wrong token where `wrong(request_id, output_index)` says so.

    Args:
        reference: request id -> its output tokens without speculation.
        wrong: (request id, output index) -> whether the proposal there is wrong.
    """

    def __init__(self, reference: dict[str, list[int]], wrong=lambda rid, i: (i * 7 + len(rid)) % 5 == 3) -> None:
        self.reference = reference
        self.wrong = wrong

    def propose(self, requests: list[Request], budgets: list[int]) -> list[list[int]]:
        out = []
        for request, k in zip(requests, budgets, strict=True):
            rid = request.request_id
            start = request.num_output_tokens
            tokens = self.reference[rid][start : start + k]
            out.append([(t + 1) % 1000 + 100 if self.wrong(rid, start + j) else t for j, t in enumerate(tokens)])
        return out


def with_proposer(engine: LLMEngine, proposer) -> LLMEngine:
    """The engine (built with a SpeculativeConfig) proposing with `proposer`."""
    engine.speculator.proposer = proposer
    return engine


def spec_config(k: int = 4, method: str = "ngram", **kwargs) -> SpeculativeConfig:
    return SpeculativeConfig(method=method, num_speculative_tokens=k, **kwargs)
