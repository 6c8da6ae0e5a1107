"""Prompt logprobs: each prompt token's log-probability given the tokens before it, from a prefill step's hidden
states at every position of the chunk (the sampler sees only the last one), for the requests that ask.

Legend: C = positions of one chunk, H = hidden size, V = vocabulary, K = top alternatives asked for.

Position p's logits predict token p + 1, so a chunk over positions [start, end) of a prompt of P tokens gives the
logprobs of tokens start + 1 .. min(end, P - 1); position P - 1 predicts the first output token, which the sampler
draws. The values are the model's raw log-softmax in float32 (no penalties, bias or temperature), as the sampler's
logprobs of output tokens are, and vLLM's prompt_logprobs.

Only steps that hold such a request look at their items (the engine tells the runner), and only those requests'
rows go through the LM head here: every other request pays nothing.
"""

from __future__ import annotations

import torch

from engine.request import Logprob, Request
from engine.scheduler import ScheduledRequest

# Rows through the LM head at once: bounds the [rows, V] float32 logits (a 4k-token chunk of a 150k vocabulary
# would be 2.4 GB at once).
ROWS_AT_ONCE = 256

PromptChunk = tuple[Request, int, list[Logprob]]  # (request, start: the first position, logprobs of tokens start+1..)


def step_prompt_logprobs(
    model: torch.nn.Module, hidden: torch.Tensor, scheduled: list[ScheduledRequest]
) -> list[PromptChunk]:
    """The prompt logprobs of the step's chunks of requests that compute them.

    Args:
        model: has compute_logits([C, H]) -> [C, V] float32.
        hidden: [T, H] the step's hidden states after the final norm, the items' tokens in order (a padded step's
            padding after them).
        scheduled: the step's items, in order.

    Returns:
        One entry per such item (its logprobs empty when the chunk holds no position that predicts a prompt
        token), so the engine sees a prompt of one token through as well.
    """
    chunks = []
    row = 0
    for item in scheduled:
        request = item.request
        start, num_new = item.num_computed_tokens, item.num_new_tokens
        # NOTE: every chunk inside the prompt of a request whose prompt logprobs are not delivered yet, the last
        # one too (a prompt of one token has nothing to compute, and still needs its chunk seen)
        if request.prompt_logprobs is not None and start < request.num_prompt_tokens:
            end = min(start + num_new, request.num_prompt_tokens - 1)  # positions start..end-1 predict prompt tokens
            next_ids = request.prompt_token_ids[start + 1 : end + 1]
            k = request.sampling_params.prompt_logprobs or 0
            logprobs = _logprobs(model, hidden[row : row + len(next_ids)], next_ids, k) if next_ids else []
            chunks.append((request, start, logprobs))
        row += num_new
    return chunks


@torch.inference_mode()
def _logprobs(model: torch.nn.Module, hidden: torch.Tensor, next_ids: list[int], k: int) -> list[Logprob]:
    """hidden [C, H] -> the logprob of next_ids[i] at row i, with its top k alternatives."""
    out: list[Logprob] = []
    for lo in range(0, len(next_ids), ROWS_AT_ONCE):
        ids = next_ids[lo : lo + ROWS_AT_ONCE]
        logprobs = torch.log_softmax(model.compute_logits(hidden[lo : lo + len(ids)]).float(), dim=-1)  # [c, V]
        targets = torch.tensor(ids, dtype=torch.int64, device=logprobs.device)
        chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
        if k > 0:
            values, indices = logprobs.topk(k, dim=-1)  # [c, K]
            tops = [dict(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
        else:
            tops = [{} for _ in ids]
        out += [Logprob(t, lp, top) for t, lp, top in zip(ids, chosen, tops, strict=True)]
    return out
