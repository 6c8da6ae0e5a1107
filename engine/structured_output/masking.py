"""The sampler's grammar step: the constrained rows' next-token masks filled on the host, then applied to the
logits on the device in one kernel (ops.apply_token_bitmask), after penalties and bias and before
temperature, top-k/top-p and the choice. Where a row has no penalties or bias (Sampler.sample_packed) the mask
goes over the LM head's output in place and the sampling kernels choose from it.

Rows without a constraint are not listed, so the kernel neither reads nor writes them; a step with no
constrained row never calls this.
"""

from __future__ import annotations

import torch

from engine import ops
from engine.request import Request
from engine.torch_sampling import host_to_device


class MaskBuffers:
    """Host bitmask rows reused step after step (pinned on CUDA, so the copy to the device is queued, not
    waited for); grown when a step has more rows."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None

    def rows(self, num_rows: int, num_words: int, pin: bool) -> torch.Tensor:
        host = self._host
        if host is None or host.shape[0] < num_rows or host.shape[1] != num_words:
            host = torch.empty(max(num_rows, 8), num_words, dtype=torch.int32, pin_memory=pin)
            self._host = host
        return host[:num_rows]


def apply_grammar_masks(logits: torch.Tensor, requests: list[Request], buffers: MaskBuffers) -> torch.Tensor:
    """logits [S, V] float (in place): each constrained row's forbidden tokens at -inf. The requests' grammar
    states hold every token sampled before this step (ModelRunner._catch_up_grammars under async scheduling)."""
    # a grammar already ended (its request finishes when its last token is processed) fills no mask
    rows = [row for row, r in enumerate(requests) if r.grammar is not None and not r.grammar.is_terminated]
    if not rows:
        return logits
    num_words = (logits.shape[1] + 31) // 32
    on_cuda = logits.is_cuda
    host = buffers.rows(len(requests), num_words, pin=on_cuda)
    for row in rows:
        requests[row].grammar.fill_next_mask(host, row)
    bitmask = host.to(logits.device, non_blocking=True) if on_cuda else host
    return ops.apply_token_bitmask(logits, bitmask, host_to_device(rows, torch.int32, logits.device))
