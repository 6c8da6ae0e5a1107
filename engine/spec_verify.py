"""Verification of proposed tokens: which of them the target model keeps.

A sequence that speculates runs its newest token and its k proposed tokens d_1..d_k through the target in
one forward (a chunk of k + 1 query tokens, as a prefill chunk runs). Row j of that chunk holds the
target's logits for the token at position L + j (L the sequence's length), given the tokens before it with
d_1..d_j in place of the tokens not yet chosen. The sampler chooses a token t_j from every row exactly as it
would without speculation: the same penalties, bias, min_tokens mask, temperature, filters and the same
counter-based noise of (seed, position) (engine/sampler.py). Row j's history is the true one as long as
d_1..d_j equal t_0..t_{j-1}; so the kept tokens are t_0..t_n, n the length of the longest prefix of the
proposal that equals the target's choices, and they are the very tokens non-speculative decoding emits,
greedy or sampled (decision 0054: the noise couples proposal and target, so no separate rejection draw).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import ops
from engine.launched_step import ModelRunnerOutput
from engine.request import Logprob, Request
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledRequest


class DraftRow:
    """A request as the sampler sees it at one verified position: its tokens plus the proposed tokens before
    that position, sampled as the request's next token would be there (the sampler reads only these fields).

    Args:
        request: the request.
        proposed: the proposed tokens before this row's position (d_1..d_j for row j).
    """

    __slots__ = ("_request", "_proposed", "sampling_params", "seed", "eos_token_ids", "num_prompt_tokens",
                 "num_prior_output_tokens", "num_pending_tokens", "num_output_tokens",
                 "num_tokens_with_pending", "grammar")  # fmt: skip

    def __init__(self, request: Request, proposed: list[int]) -> None:
        self._request = request
        self._proposed = proposed
        self.sampling_params: SamplingParams = request.sampling_params
        self.seed = request.seed
        self.eos_token_ids = request.eos_token_ids
        self.num_prompt_tokens = request.num_prompt_tokens
        self.num_prior_output_tokens = request.num_prior_output_tokens
        self.num_pending_tokens = 0  # verification steps are synchronous: no token is pending
        self.num_output_tokens = request.num_output_tokens + len(proposed)
        self.num_tokens_with_pending = request.num_tokens + len(proposed)
        self.grammar = None  # constrained requests do not speculate (engine/speculator.py)

    @property
    def all_token_ids(self) -> list[int]:
        """Read only by penalties; built on demand (a copy of the request's tokens)."""
        return self._request.all_token_ids + self._proposed


@dataclass
class Verified:
    """One speculating request's outcome of a verification step.

    Args:
        token_ids: the kept tokens, t_0..t_n (n accepted proposals plus the target's own next token).
        logprobs: per kept token, when the request asks for logprobs.
        error: a non-finite logit row among the kept positions (the tokens before it are kept).
        num_proposed: k of this step (the proposal's length).
        num_accepted: n, proposals that equal the target's choices.
    """

    token_ids: list[int]
    logprobs: list[Logprob | None]
    error: str | None
    num_proposed: int
    num_accepted: int


def draft_rows(request: Request, proposed: list[int]) -> list[DraftRow]:
    """The k + 1 sampler rows of a request verifying `proposed`, in position order."""
    return [DraftRow(request, proposed[:j]) for j in range(len(proposed) + 1)]


def accept(
    proposed: list[int], chosen: list[int], logprobs: list[Logprob | None], errors: list[str | None]
) -> Verified:
    """The longest prefix of `proposed` that equals the target's choices, and the target's token after it.

    Args:
        proposed: d_1..d_k.
        chosen: t_0..t_k, the target's choice at each of the k + 1 rows.
        logprobs, errors: per row, as the sampler returns them.
    """
    n = 0
    while n < len(proposed) and proposed[n] == chosen[n]:
        n += 1
    kept = n + 1
    error = None
    for j in range(kept):
        if errors[j] is not None:  # the row's logits are not finite: the tokens before it stand
            kept, error = j, errors[j]
            break
    return Verified(chosen[:kept], logprobs[:kept], error, len(proposed), n)


def verify_step(
    sampler: Sampler, logits: torch.Tensor, items: list[ScheduledRequest], sampling: list[int], *, greedy: bool = False
) -> ModelRunnerOutput:
    """The tokens of a step in which some sequences verify proposals, others sample one token as usual.

    Args:
        sampler: the runner's sampler.
        logits: [R, V] the step's sampling rows (k + 1 for a verifying sequence, 1 for another).
        items: the step's scheduled requests.
        sampling: the item index of each row, in order (engine/input_batch.py: StepInputs.sampling).
        greedy: every row is plain greedy (engine/model_runner.py's word): the greedy kernel chooses.

    Rows that ask for logprobs go through the Sampler's torch path (it builds them on the host); the others
    take the sampling kernels, as a step without speculation does (the same tokens either way).
    """
    rows, order = _sampler_rows(items, sampling)
    if greedy:
        return _kept_choices(ops.greedy_sample(logits), rows, items, order)
    if any(row.sampling_params.logprobs is not None for row in rows):
        out = sampler(logits, rows)
        return _kept(items, order, out.token_ids, out.logprobs, out.errors)
    return _kept_choices(sampler.sample_packed(logits, rows), rows, items, order)


def verify_chosen(chosen: torch.Tensor, items: list[ScheduledRequest], sampling: list[int]) -> ModelRunnerOutput:
    """verify_step's outcome where the step's CUDA graph already chose every row greedily: chosen [2, >= R] int64
    (token, 1 where the row's logits were all finite), rows 0..R-1 the step's sampling rows in order (padding rows
    after them)."""
    rows, order = _sampler_rows(items, sampling)
    return _kept_choices(chosen, rows, items, order)


def _sampler_rows(items: list[ScheduledRequest], sampling: list[int]) -> tuple[list[Request | DraftRow], list[int]]:
    """(the sampler's view of each row, the item index of each request's first row in row order)."""
    rows: list[Request | DraftRow] = []
    order: list[int] = []
    for index in sampling:
        if order and order[-1] == index:
            continue
        order.append(index)
        item = items[index]
        rows.extend(draft_rows(item.request, item.proposed_token_ids) if item.proposed_token_ids else [item.request])
    return rows, order


def _kept_choices(
    packed: torch.Tensor, rows: list[Request | DraftRow], items: list[ScheduledRequest], order: list[int]
) -> ModelRunnerOutput:
    """Acceptance over tokens chosen on the device: packed [2, >= R] int64 (token, 1 where the row's logits were
    all finite), rows 0..R-1 the step's sampling rows.

    NOTE: reads the choices on the host (the step's one sync): acceptance decides how many tokens each request
    keeps, which the next step's scheduling needs."""
    token_ids, finite = packed[:, : len(rows)].tolist()
    errors = [None if ok else f"non-finite logits at position {row.num_tokens_with_pending}"
              for row, ok in zip(rows, finite, strict=True)]  # fmt: skip
    return _kept(items, order, token_ids, [None] * len(rows), errors)


def _kept(
    items: list[ScheduledRequest],
    order: list[int],
    token_ids: list[int],
    logprobs: list[Logprob | None],
    errors: list[str | None],
) -> ModelRunnerOutput:
    """Each request's kept tokens from its rows' choices, as the step's output."""
    requests, verified = [], []
    row = 0
    for index in order:
        item = items[index]
        n = len(item.proposed_token_ids) + 1
        span = slice(row, row + n)
        verified.append(accept(item.proposed_token_ids, token_ids[span], logprobs[span], errors[span]))
        requests.append(item.request)
        row += n
    result = ModelRunnerOutput(
        requests,
        [v.token_ids[0] if v.token_ids else 0 for v in verified],
        [v.logprobs[0] if v.logprobs else None for v in verified],
        [v.error if not v.token_ids else None for v in verified],
    )
    result.verified = verified
    return result
