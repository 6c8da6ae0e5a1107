"""One choice's position in its grammar: the tokens accepted so far and the mask of the next token."""

from __future__ import annotations

import torch
import xgrammar as xgr


class GrammarState:
    """A request choice's matcher.

    Args:
        compiled: the request's compiled grammar.
        prior_token_ids: output an earlier run of the request already emitted (resumption): accepted first, so
            the matcher continues where that run stopped.
    """

    def __init__(self, compiled: xgr.CompiledGrammar, prior_token_ids: list[int] = ()) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        # accept_ahead's verdict on the pending token it took, until the output processor reaches that token
        self._ahead: bool | None = None
        self._probe = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
        for token in prior_token_ids:
            if not self._matcher.accept_token(int(token)):
                raise ValueError(f"structured_output: the resumed output's token {token} breaks the constraint")

    def ends_after(self, token_id: int) -> bool:
        """Advances past a sampled token (unless accept_ahead already did); True when the output must end
        there: the grammar is complete and allows no token but a stop token, or it rejected the token (the
        mask makes that impossible, but a request never continues past a token its grammar did not take)."""
        if self._ahead is not None:
            verdict, self._ahead = self._ahead, None
            return verdict
        return self._advance(token_id)

    def accept_ahead(self, token_id: int) -> None:
        """Takes a token the host has not yet processed (async scheduling: the next step's mask needs it);
        ends_after of that token then returns this verdict without advancing again."""
        if self._ahead is None:
            self._ahead = self._advance(token_id)

    def drop_ahead(self) -> None:
        """Undoes accept_ahead for a token that will never be processed (a step rolled back after a failure)."""
        if self._ahead is not None:
            self._ahead = None
            self._matcher.rollback(1)

    def _advance(self, token_id: int) -> bool:
        if not self._matcher.accept_token(token_id):
            return True
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        probe = self._probe
        self._matcher.fill_next_token_bitmask(probe, 0)
        stops = self._matcher.stop_token_ids
        for token in stops:  # the stop tokens' bits off: any bit left is a token that continues the text
            bit = 1 << (token % 32)
            probe[0, token // 32] &= ~(bit - (1 << 32) if bit >= 1 << 31 else bit)  # bit 31 as int32
        return not bool(probe.any())

    def accept(self, token_id: int) -> bool:
        """Advances past a sampled token; False when the grammar rejects it (the state is then unchanged)."""
        return self._matcher.accept_token(token_id)

    def fill_next_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the allowed next tokens into row `row` of bitmask [R, W] int32 (on the host)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted."""
        return self._matcher.is_terminated()

    @property
    def is_complete(self) -> bool:
        """Only a stop token may follow (the constrained text is whole)."""
        return self._matcher.is_completed()
