"""Speculative decoding's side of the engine loop: whether a step speculates (the policy), which running
requests get proposals and how many tokens, and the acceptance counters.

LLMEngine asks `wants_step` before it schedules; when it says yes, the engine reads every step in flight
(proposals need each request's newest token on the host), `propose` sets the proposals the scheduler gives
budget to, and the step verifies them (engine/spec_verify.py). After the step, `keep_verified` rolls the
requests' computed tokens back to the kept ones and counts what was kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig, SpeculativeConfig
from engine.draft_proposer import build_draft_proposer
from engine.proposers import Proposer, make_proposer
from engine.request import Request, RequestStatus
from engine.scheduler import ScheduledRequest
from engine.spec_verify import Verified

_RATE_WEIGHT = 0.5  # each verifying step's weight in the recent acceptance rate (decision 0069)


@dataclass
class SpecDecodeStats:
    """Counters over the engine's life (vLLM's spec_decode_* metrics).

    Attributes:
        num_drafts: proposals verified (one per speculating request and step).
        num_draft_tokens: proposed tokens verified.
        num_accepted_tokens: proposed tokens kept.
        accepted_per_position: [k] how often the proposal's token i was kept.
        num_steps: steps that verified proposals.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    num_steps: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verifying request gains per step: accepted proposals plus the target's own token."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class Speculator:
    """Decides and prepares each step's speculation.

    Args:
        config: the engine's SpeculativeConfig (method set).
        proposer: the proposer; None builds the one of config.method.
    """

    def __init__(self, config: SpeculativeConfig, proposer: Proposer | None = None) -> None:
        self.config = config
        self.proposer = (
            proposer if proposer is not None else make_proposer(config.method, config.ngram_max, config.ngram_min)
        )
        self.stats = SpecDecodeStats(accepted_per_position=[0] * config.num_speculative_tokens)
        self.recent_acceptance_rate = 1.0
        self._steps_below_rate = 0

    def wants_step(self, num_running: int) -> bool:
        """The policy, per step: no speculation in a batch larger than max_batch_size (verifying k + 1 tokens
        a sequence then costs more compute than the weight reads it saves), nor while the recent acceptance
        rate is below min_acceptance_rate, except every probe_interval-th such step (so the rate can recover).
        The rate is an exponential average over speculating steps of the fraction of proposed tokens kept, a
        step that proposed nothing counting as 0."""
        if num_running == 0 or num_running > self.config.max_batch_size:
            return False
        if self.recent_acceptance_rate >= self.config.min_acceptance_rate:
            self._steps_below_rate = 0
            return True
        self._steps_below_rate += 1
        return self._steps_below_rate % self.config.probe_interval == 0

    def propose(self, running: list[Request]) -> list[Request]:
        """Sets the proposals of the running requests that can verify some this step; returns those requests
        (the engine clears their proposals once the step is scheduled)."""
        candidates = [r for r in running if _can_speculate(r)]
        k = self.config.num_speculative_tokens
        # kept tokens = accepted + 1: a request never holds more than max_num_tokens
        budgets = [min(k, r.max_num_tokens - r.num_tokens - 1) for r in candidates]
        proposed = []
        for request, tokens in zip(candidates, self.proposer.propose(candidates, budgets), strict=True):
            if tokens:
                request.proposed_token_ids = tokens
                proposed.append(request)
        if candidates and not proposed:
            # a speculating step is synchronous: one that finds nothing to verify gave up async scheduling for
            # nothing, so it counts as a step of no accepted tokens (text that never repeats turns speculation off).
            # A step with no request that could speculate (each at its last token, or in its prefill) says nothing
            # of the proposer: at weight 0.5 it would turn speculation off for the next request.
            self._update_rate(0.0)
        return proposed

    def keep_verified(self, items: list[ScheduledRequest], verified: list[Verified], blocks: BlockManager) -> None:
        """After a verification step's tokens are processed: the KV of rejected proposals is dropped, and the
        outcome counted. A verifying request computed its newest token and every proposal; it keeps the
        accepted ones and the model's token after them, so its KV is right up to (not including) its newest
        token. The slots past that hold rejected tokens' K/V: they are past num_computed_tokens, so no step
        reads them before one writes them again, and no block holding one is hashed (cache_full_blocks hashes
        only blocks of computed tokens)."""
        for item in items:
            request = item.request
            if not item.proposed_token_ids or request.is_finished:
                continue
            request.num_computed_tokens = request.num_tokens - 1
            blocks.cache_full_blocks(request, request.num_computed_tokens)
        self.record(verified)

    def record(self, verified: list[Verified]) -> None:
        """Counts a verification step's outcome and updates the recent acceptance rate."""
        stats = self.stats
        drafted = accepted = 0
        for v in verified:
            if not v.num_proposed:
                continue
            stats.num_drafts += 1
            drafted += v.num_proposed
            accepted += v.num_accepted
            for position in range(v.num_accepted):
                stats.accepted_per_position[position] += 1
        if not drafted:
            return
        stats.num_steps += 1
        stats.num_draft_tokens += drafted
        stats.num_accepted_tokens += accepted
        self._update_rate(accepted / drafted)

    def _update_rate(self, rate: float) -> None:
        self.recent_acceptance_rate += _RATE_WEIGHT * (rate - self.recent_acceptance_rate)


def _can_speculate(request: Request) -> bool:
    """A running request with its newest token read and every token before it in the KV cache (it decodes),
    that has not opted out, with room for at least one more token after the next. A constrained request
    (structured output) does not speculate: its proposals would need the grammar's masks at every proposed
    position."""
    return (
        request.status is RequestStatus.RUNNING
        and request.num_pending_tokens == 0
        and request.num_computed_tokens == request.num_tokens - 1
        and request.sampling_params.speculative
        and request.sampling_params.structured_output is None
        and request.max_num_tokens is not None
        and request.max_num_tokens - request.num_tokens >= 2
    )


def build_speculator(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, vocab_size: int, max_model_len: int,
    cache_dir: str | None,
) -> Speculator | None:  # fmt: skip
    """The engine's Speculator (None when speculation is off), with its draft model loaded where it has one."""
    spec = config.speculative
    if spec.method is None:
        return None
    if spec.method == "draft":
        draft = build_draft_proposer(config, device, dtype, vocab_size, max_model_len, cache_dir)
        return Speculator(spec, draft)
    return Speculator(spec)
