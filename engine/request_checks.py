"""What LLMEngine.add_request checks of a request against the model (its context and vocabulary), and how
it splits the output a previous run emitted. SamplingParams checks everything that needs no model."""

from __future__ import annotations

from engine.sampling_params import SamplingParams


def check_prompt(prompt_token_ids: list[int], params: SamplingParams, max_model_len: int, vocab_size: int) -> None:
    """Raises ValueError naming the field and the limit: the prompt (and max_tokens) within the context,
    and every token id the request names (prompt, logit_bias keys, stop_token_ids) in the vocabulary."""
    n = len(prompt_token_ids)
    if n == 0:
        raise ValueError("prompt must hold at least one token")
    if n >= max_model_len:
        raise ValueError(
            f"prompt is {n} tokens, but max_model_len is {max_model_len} "
            "(the prompt must leave room for at least one output token)"
        )
    if params.max_tokens is not None and n + params.max_tokens > max_model_len:
        raise ValueError(
            f"max_tokens ({params.max_tokens}) plus the prompt ({n} tokens) exceeds max_model_len ({max_model_len})"
        )
    for i, token in enumerate(prompt_token_ids):
        if not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ValueError(f"prompt_token_ids[{i}] = {token!r} is outside the vocabulary [0, {vocab_size})")
    # NOTE: the sampler would skip an id past the logits' width; a caller who named one gets told instead
    for token in params.logit_bias or {}:
        if not 0 <= token < vocab_size:
            raise ValueError(f"logit_bias key {token} is outside the vocabulary [0, {vocab_size})")
    for i, token in enumerate(params.stop_token_ids):
        if not 0 <= token < vocab_size:
            raise ValueError(f"stop_token_ids[{i}] = {token} is outside the vocabulary [0, {vocab_size})")


def split_priors(prior: list[int] | list[list[int]] | None, n: int) -> list[list[int]]:
    """prior_output_token_ids as one list per choice (a flat list for n == 1)."""
    if not prior:
        return [[] for _ in range(n)]
    if n == 1 and all(isinstance(t, int) for t in prior):
        return [list(prior)]  # type: ignore[arg-type]
    if len(prior) != n or not all(isinstance(p, list) for p in prior):
        raise ValueError(f"prior_output_token_ids must hold one list per choice (n = {n})")
    return [list(p) for p in prior]  # type: ignore[arg-type]
