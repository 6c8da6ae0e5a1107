"""The draft-model proposer: a smaller checkpoint with the target's tokenizer guesses the next k tokens.

The draft runs on the engine's own parts: a ModelRunner (its paged KV pool, kernels, CUDA graphs for its
one-token steps) and a BlockManager of its own. Each target request has a shadow request in the draft: the same
prompt, output, sampling parameters and seed. Proposing is k draft steps over all shadows together; each step
samples a shadow's next token with the target's sampler rules and the same (seed, position) noise, so where
the draft's distribution is close to the target's the two choose the same token, sampled rows included
(verification keeps exactly the target's choices: engine/spec_verify.py).

Rolling back is bookkeeping: before proposing, a shadow takes the target request's tokens; its computed tokens
are cut to the prefix it shares with them, and its next step recomputes from there (the slots after hold the
rejected guesses, overwritten before they are read).
"""

from __future__ import annotations

import logging

import torch

from engine.block_manager import BlockManager
from engine.engine_setup import build_model_runner
from engine.model_runner import ModelRunner
from engine.request import Request, RequestStatus
from engine.scheduler import ScheduledRequest, SchedulerOutput

logger = logging.getLogger(__name__)


class DraftProposer:
    """Proposes with a draft model.

    Args:
        runner: the draft model's runner (its own KV pool).
        target_vocab_size: the target's vocabulary; a draft token outside it ends the proposal.
        max_num_batched_tokens, max_num_seqs: the draft runner's step limits.
    """

    def __init__(self, runner: ModelRunner, target_vocab_size: int, max_num_batched_tokens: int, max_num_seqs: int):
        self.runner = runner
        self.blocks = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
        self.target_vocab_size = target_vocab_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self._shadows: dict[str, tuple[Request, Request]] = {}  # request id -> (target request, shadow)
        self._synced_len: dict[str, int] = {}  # request id -> the request's token count at its shadow's last sync

    def propose(self, requests: list[Request], budgets: list[int]) -> list[list[int]]:
        self._forget_finished()
        active = [(self._synced(r), k) for r, k in zip(requests, budgets, strict=True) if k > 0]
        proposals: dict[Request, list[int]] = {shadow: [] for shadow, _ in active}
        stopped: set[Request] = set()
        for _ in range(max((k for _, k in active), default=0)):
            group = [s for s, k in active if len(proposals[s]) < k and s not in stopped]
            if not group:
                break
            for shadow, token in self._next_tokens(group).items():
                if token is None or not 0 <= token < self.target_vocab_size:
                    stopped.add(shadow)
                    continue
                proposals[shadow].append(token)
                shadow.append_token(token)
        shadow_of = {request_id: shadow for request_id, (_, shadow) in self._shadows.items()}
        return [proposals[shadow_of[r.request_id]] if k > 0 else [] for r, k in zip(requests, budgets, strict=True)]

    # ---- shadows -------------------------------------------------------------------------
    def _synced(self, request: Request) -> Request:
        """The request's shadow holding the request's tokens, its computed tokens cut to the prefix it shares with
        them (the accepted guesses stay computed, the rejected ones are dropped)."""
        entry = self._shadows.get(request.request_id)
        if entry is None or entry[0] is not request:
            if entry is not None:
                self.blocks.free(entry[1])
            self._synced_len.pop(request.request_id, None)
            shadow = Request(
                request.request_id,
                list(request.prompt_token_ids),
                request.sampling_params,
                eos_token_ids=request.eos_token_ids,
                seed=request.seed,
                num_prior_output_tokens=request.num_prior_output_tokens,
                max_num_tokens=request.max_num_tokens,
            )
            shadow.status = RequestStatus.RUNNING
            self._shadows[request.request_id] = (request, shadow)
            return self._synced(request)
        shadow = entry[1]
        mine, theirs = shadow.all_token_ids, request.all_token_ids
        common = min(len(mine), len(theirs))
        # only the tokens after the last sync can differ: the request's tokens never change once it has them
        for i in range(self._synced_len.get(request.request_id, request.num_prompt_tokens), common):
            if mine[i] != theirs[i]:
                common = i
                break
        self._synced_len[request.request_id] = len(theirs)
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common)
        shadow.all_token_ids = list(theirs)
        shadow.output_token_ids = list(request.output_token_ids)
        return shadow

    def _forget_finished(self) -> None:
        for request_id, (request, shadow) in list(self._shadows.items()):
            if request.is_finished:
                self.blocks.free(shadow)
                del self._shadows[request_id]
                self._synced_len.pop(request_id, None)

    def _make_room(self, keep: set[Request]) -> bool:
        """Frees the shadow of a request not in this step (it starts over when it speculates again)."""
        for request_id, (_, shadow) in self._shadows.items():
            if shadow not in keep and self.blocks.get_block_ids(request_id):
                self.blocks.free(shadow)
                shadow.num_computed_tokens = 0
                return True
        return False

    # ---- draft steps ---------------------------------------------------------------------
    def _next_tokens(self, shadows: list[Request]) -> dict[Request, int | None]:
        """Each shadow's next token (None: no room in the draft's pool, or non-finite logits): its tokens not
        yet computed run through the draft in chunks under the step budget, the last chunk samples."""
        keep = set(shadows)
        tokens: dict[Request, int | None] = {}
        waiting = list(shadows)
        while waiting:
            budget, items = self.max_num_batched_tokens, []
            for shadow in waiting[: self.max_num_seqs]:
                need = shadow.num_tokens - shadow.num_computed_tokens
                num_new = min(need, budget)
                if num_new <= 0:
                    break
                while not self.blocks.allocate_slots(shadow, num_new):
                    if not self._make_room(keep):
                        tokens[shadow] = None
                        break
                else:
                    computed, block_ids = shadow.num_computed_tokens, self.blocks.get_block_ids(shadow.request_id)
                    items.append(ScheduledRequest(shadow, num_new, computed, block_ids, num_new == need))
                    budget -= num_new
            if items:
                result = self.runner.launch(SchedulerOutput(items)).result()
                for item in items:
                    item.request.num_computed_tokens += item.num_new_tokens
                for shadow, token, error in zip(result.requests, result.token_ids, result.errors, strict=True):
                    tokens[shadow] = None if error is not None else token
            waiting = [s for s in waiting if s not in tokens]
        return tokens


def build_draft_proposer(
    config, device: torch.device, dtype: torch.dtype, target_vocab_size: int, max_model_len: int,
    cache_dir: str | None = None,
) -> DraftProposer:  # fmt: skip
    """The draft of EngineConfig `config` (speculative.draft_model), loaded and given its own KV pool."""
    from engine.config import ModelConfig
    from engine.kv_cache import DEFAULT_CPU_KV_TOKENS
    from engine.model_loader import load_model

    spec, sched = config.speculative, config.scheduler
    model_config = ModelConfig(
        model=spec.draft_model,
        dtype=config.model.dtype,
        max_model_len=max_model_len,
        load_format=spec.draft_load_format,
        seed=config.model.seed + 1,
        generation_defaults="none",
    )
    loaded = load_model(model_config, device, dtype, cache_dir=cache_dir)
    draft_vocab = int(loaded.hf_config.vocab_size)
    if draft_vocab > target_vocab_size + 1024 or draft_vocab < target_vocab_size - 1024:
        raise ValueError(
            f"draft_model {spec.draft_model!r} has a vocabulary of {draft_vocab} tokens, the model "
            f"{target_vocab_size}: a draft must share the model's tokenizer"
        )
    num_kv_tokens = spec.draft_num_kv_tokens or (config.cache.num_kv_tokens or DEFAULT_CPU_KV_TOKENS)
    runner = build_model_runner(config, loaded.model, device, dtype, max_model_len, num_kv_tokens=num_kv_tokens,
                                draft=True)  # fmt: skip
    logger.info("draft model %s: KV pool of %d tokens", loaded.model_dir, runner.num_blocks * config.cache.block_size)
    return DraftProposer(runner, target_vocab_size, sched.max_num_batched_tokens, sched.max_num_seqs)
