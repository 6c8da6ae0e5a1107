"""Continuous-batching scheduler. Pure Python.

There is no prefill phase and no decode phase. Each request needs
`num_tokens - num_computed_tokens` more tokens through the model; each step hands
out a token budget, first to running requests (in order), then to waiting ones
while KV blocks last. A prompt longer than what is left of the budget is simply
cut (chunked prefill). When a running request cannot get a block, the request at
the tail of the running list (the newest, or the lowest priority) is preempted:
its blocks are freed and it is recomputed later from its tokens (prefix caching
usually makes that cheap). Under the priority policy a waiting request also takes the
place (slot or blocks) of a running one of strictly lower priority (decision 0062), and while one of priority 0
or below runs, at most `max_background_seqs` of priority above 0 run beside it (decision 0066).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import FinishReason, Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    Args:
        request: the request.
        num_new_tokens: tokens to compute this step, starting at `num_computed_tokens`.
        num_computed_tokens: tokens already in the KV cache before this step.
        block_ids: the request's block table after allocation.
        samples: whether this step reaches the end of the request's tokens (so a token is sampled).
        proposed_token_ids: speculative decoding: proposed tokens after the request's own, the last of the
            step's new tokens (they are verified: engine/spec_verify.py).
    """

    request: Request
    num_new_tokens: int
    num_computed_tokens: int
    block_ids: list[int]
    samples: bool
    proposed_token_ids: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """The only thing the model runner sees of the scheduler."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    new_request_ids: list[str] = field(default_factory=list)  # first scheduled in this step
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides, every step, which requests run and with how many tokens.

    Args:
        config: batching limits and policy.
        block_manager: the KV block pool.
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # running requests of priority above 0 (background), kept where `running` changes: the background cap reads
        # it for every admission, and a walk of `running` there cost a full batch's length
        self.num_background_running = 0
        self.num_preemptions = 0

    # ---- queue management ---------------------------------------------
    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        if self.config.policy == "priority":
            self._insert_waiting(request)
        else:
            self.waiting.append(request)

    def _insert_waiting(self, request: Request) -> None:
        """Keeps `waiting` sorted by (priority, arrival); new arrivals rarely jump far."""
        key = (request.priority, request.arrival_time)
        index = len(self.waiting)
        while index > 0 and (self.waiting[index - 1].priority, self.waiting[index - 1].arrival_time) > key:
            index -= 1
        self.waiting.insert(index, request)

    def finish_request(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        """Take a request out of the queues and free its blocks."""
        if request.status is RequestStatus.RUNNING:
            self._remove_running(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request)
        request.finish(reason, error)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- the step's decision -------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        # 1. Running requests first, in order; preempt from the tail when blocks run out.
        index = 0
        tables, block_size = self.block_manager.block_tables, self.block_manager.block_size
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_new_tokens_needed + len(request.proposed_token_ids), budget)
            if num_new <= 0:
                index += 1
                continue
            # NOTE: the decode step's case first (this runs for every running request at every step): the new
            # tokens fit in the blocks the request holds, so there is nothing to allocate
            table = tables.get(request.request_id)
            if table is not None and request.num_computed_tokens + num_new <= len(table) * block_size:
                out.scheduled.append(self._scheduled(request, num_new, table))
                budget -= num_new
                index += 1
                continue
            while not self.block_manager.allocate_slots(request, num_new):
                if num_new > request.num_new_tokens_needed:
                    # proposed tokens never preempt a request: without room they are dropped
                    num_new = min(request.num_new_tokens_needed, budget)
                    continue
                victim = self._pick_victim()
                if self.running.index(victim) < index:
                    index -= 1
                budget += self._preempt(victim, out)
                if victim is request:
                    break
            else:
                out.scheduled.append(self._scheduled(request, num_new))
                budget -= num_new
                index += 1

        # 2. Waiting requests, while budget, sequence slots and blocks last. No admission
        #    in a step that had to preempt: the pool is already too tight.
        if not out.preempted_request_ids:
            self._admit_waiting(out, budget)
        return out

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        skipped: list[Request] = []
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if request.request_id in out.preempted_request_ids:
                break  # preempted for the requests before it: not back in the step that took its place
            if self._background_is_capped(request):
                break  # `waiting` is in priority order: the rest are background work too
            if len(self.running) >= self.config.max_num_seqs:
                victim = self._outranked_by(request)
                if victim is None:
                    break
                budget += self._preempt(victim, out)  # a slot for a higher priority (decision 0062)
                continue
            if self._waits_for_sibling(request):
                skipped.append(self.waiting.popleft())
                continue
            # NOTE: a waiting request has no pending token: one preempted with a token pending is
            # never admitted in the same step (no admission after a preemption), and the engine
            # reads every pending token before it schedules the step after.
            # a request that computes prompt logprobs needs every prompt position's logits: no cached prefix
            computed = [] if request.computes_prompt_logprobs else self.block_manager.get_computed_blocks(request)
            num_computed = len(computed) * self.block_manager.block_size
            num_new = min(request.num_tokens - num_computed, budget)
            request.num_computed_tokens = num_computed
            if not self.block_manager.allocate_slots(request, num_new, computed):
                request.num_computed_tokens = 0
                victim = self._outranked_by(request)
                if victim is None:
                    break
                budget += self._preempt(victim, out)  # its blocks for a higher priority
                continue
            self.waiting.popleft()
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
                request.num_cached_tokens = num_computed
                out.new_request_ids.append(request.request_id)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.num_background_running += request.priority > 0
            out.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        # Siblings that must wait go back to the front, in their order.
        self.waiting.extendleft(reversed(skipped))

    def _background_is_capped(self, request: Request) -> bool:
        """Whether background work (priority above 0) is held back: a request of priority 0 or below runs and
        `max_background_seqs` background ones already do. A full-width batch makes every step several times longer
        (4.6x at the Qwen3-0.6B shape on an H200), and an interactive request's TTFT and ITL with it; capped, the
        batch gives up width only while interactive requests run. Running ones are not preempted for the cap:
        they finish and are not replaced."""
        cap = self.config.max_background_seqs
        if cap is None or request.priority <= 0 or self.config.policy != "priority":
            return False
        background = self.num_background_running
        return len(self.running) > background and background >= cap

    def _remove_running(self, request: Request) -> None:
        self.running.remove(request)
        self.num_background_running -= request.priority > 0

    def _waits_for_sibling(self, request: Request) -> bool:
        """n > 1: later choices wait until the first one's prompt is in the cache, then share it."""
        if request.parent_id is None or request.choice_index == 0 or not self.block_manager.enable_prefix_caching:
            return False
        for other in self.running:
            if other.parent_id == request.parent_id and other.num_computed_tokens < request.num_prompt_tokens:
                return True
        return any(
            other.parent_id == request.parent_id and other.choice_index < request.choice_index for other in self.waiting
        )

    def _outranked_by(self, request: Request) -> Request | None:
        """Under the priority policy, the running request a waiting one of strictly higher priority (a lower
        value) may take the place of: the lowest priority, the newest among equals; else None. vLLM's priority
        scheduling preempts so too: an interactive request never waits for a batch line to finish."""
        # NOTE: the plain max first: at a full batch this runs every step a request waits, and with equal
        # priorities (the common case) it ends there without building a key for every running request
        if self.config.policy != "priority" or not self.running:
            return None
        if max(r.priority for r in self.running) <= request.priority:
            return None
        return self._pick_victim()

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request, out: SchedulerOutput) -> int:
        """Preempts by recompute; returns the budget the request had taken in this step."""
        self._remove_running(request)
        # A request preempted after being scheduled earlier in this same step loses that slot.
        refund = sum(s.num_new_tokens for s in out.scheduled if s.request is request)
        out.scheduled = [s for s in out.scheduled if s.request is not request]
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.proposed_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions += 1
        if self.config.policy == "priority":
            self._insert_waiting(request)  # behind the waiting requests that outrank it
        else:
            self.waiting.appendleft(request)
        out.preempted_request_ids.append(request.request_id)
        return refund

    def _scheduled(self, request: Request, num_new: int, block_ids: list[int] | None = None) -> ScheduledRequest:
        """block_ids: the request's block table when the caller has it (the block manager's own list)."""
        computed = request.num_computed_tokens
        num_proposed = computed + num_new - request.num_tokens_with_pending  # > 0: proposals within the budget
        return ScheduledRequest(
            request,
            num_new,
            computed,
            block_ids if block_ids is not None else self.block_manager.get_block_ids(request.request_id),
            num_proposed >= 0,
            request.proposed_token_ids[:num_proposed] if num_proposed > 0 else [],
        )
