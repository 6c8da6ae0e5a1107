"""LLMEngine: requests in, one scheduler decision + one forward + one sampling per
`step()`, text deltas out. Single-threaded; the worker and the offline `LLM` drive it. With
async scheduling a step's tokens are read during the next `step()` call, after that call
has launched its own work (the host's Python overlaps the device's step).
"""

from __future__ import annotations

import logging
import time

import torch

from engine import ops
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import make_detokenizer
from engine.engine_setup import build_model_runner, resolve_device, resolve_dtype
from engine.generation_defaults import GenerationDefaults
from engine.launched_step import LaunchedStep
from engine.live_requests import LiveRequests
from engine.model_loader import check_tensor_parallel_model, load_model
from engine.output_processor import OutputProcessor
from engine.outputs import EngineStats, RequestOutput, StepRecord
from engine.parallel.group import SINGLE
from engine.parallel.launch import RankGroup
from engine.request import FinishReason, Request, RequestStatus
from engine.request_checks import check_prompt
from engine.request_choices import choices_of, reads_history
from engine.sampling_params import SamplingParams, check_priority
from engine.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from engine.speculator import build_speculator
from engine.structured_output.admission import ConstrainedAdmission
from engine.structured_output.constraint import constraint_key
from engine.tokenizer import (
    apply_chat_template,
    eos_token_ids,
    fast_decoder,
    load_generation_config,
    load_tokenizer,
)
from kernels._pdl import set_pdl, use_pdl

logger = logging.getLogger(__name__)


class LLMEngine:
    """The engine: one model on one device, continuously batched.

    Args:
        config: the engine configuration.
        cache_dir: where converted checkpoints (GGUF) are kept; None takes the default.
    """

    def __init__(self, config: EngineConfig, cache_dir: str | None = None) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.model.dtype, self.device)
        ops.set_kernel_backend(config.kernels)
        if config.pdl is not None:  # None: as the process has it (INFERQ_PDL, or set_pdl by a benchmark)
            set_pdl(config.pdl)
        started = time.monotonic()
        # tensor parallelism: the other ranks start now and build their shards beside this one's
        size = config.parallel.tensor_parallel_size
        if size > 1:
            check_tensor_parallel_model(config.model, size, cache_dir)
        self.rank_group = RankGroup(config, self.device, cache_dir) if size > 1 else None
        try:
            self._build(config, cache_dir, started)
        except BaseException:
            if self.rank_group is not None:
                self.rank_group.close(timeout_s=5.0)
            raise

    def _build(self, config: EngineConfig, cache_dir: str | None, started: float) -> None:
        tp = self.rank_group.tp if self.rank_group is not None else SINGLE
        loaded = load_model(config.model, self.device, self.dtype, cache_dir=cache_dir, tp=tp)
        self.model = loaded.model
        self.hf_config = loaded.hf_config
        self.model_dir = loaded.model_dir
        self.max_model_len = loaded.max_model_len
        self.vocab_size = int(self.hf_config.vocab_size)
        self.tokenizer = load_tokenizer(self.model_dir)
        self._token_decoder = fast_decoder(self.tokenizer)
        generation_config = load_generation_config(self.model_dir)
        self.eos_token_ids = frozenset(eos_token_ids(self.hf_config, generation_config, self.tokenizer))
        self.generation_defaults = GenerationDefaults.from_checkpoint(self.model_dir, config.model.generation_defaults)
        logger.info(
            "sampling defaults where a request is silent (generation_defaults=%s): %s",
            config.model.generation_defaults,
            self.generation_defaults.describe(),
        )
        sched = config.scheduler
        # NOTE: before the runner: on CUDA the model's KV pool takes the memory a draft model leaves
        self.speculator = build_speculator(
            config, self.device, self.dtype, self.vocab_size, self.max_model_len, cache_dir
        )
        self.runner = build_model_runner(config, self.model, self.device, self.dtype, self.max_model_len, tp)
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching
        )
        self.scheduler = Scheduler(sched, self.block_manager)
        self.live = LiveRequests()
        self.requests = self.live.requests  # internal id -> request (the same dict)
        self.output_processor = OutputProcessor(self.scheduler, self.live)
        self.async_scheduling = (
            config.async_scheduling if config.async_scheduling is not None else self.device.type == "cuda"
        )
        self._in_flight: list[tuple[SchedulerOutput, LaunchedStep]] = []  # launched, tokens not read; oldest first
        self.last_step = StepRecord()
        self._num_steps = 0
        self._num_prompt_computed = 0
        # structured output: constrained requests wait out of the scheduler for their grammar
        self.constrained = ConstrainedAdmission(self.tokenizer, self.vocab_size, sorted(self.eos_token_ids))
        logger.info(
            "engine ready: %s on %s (%s), max_model_len %d, kernels %s, PDL %s, %.1fs",
            self.model_dir,
            self.device,
            self.dtype,
            self.max_model_len,
            ops.get_kernel_backend(),
            "on" if use_pdl(self.device) else "off",
            time.monotonic() - started,
        )

    # ---- tokenization -------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return apply_chat_template(self.tokenizer, messages, tools=tools)

    def sampling_params(self, params: dict) -> SamplingParams:
        """A request's SamplingParams: the fields it sets over the model's defaults (generation_defaults)."""
        return self.generation_defaults.sampling_params(params)

    # ---- requests -------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        prior_output_token_ids: list[int] | list[list[int]] | None = None,
    ) -> None:
        """Queues a request.

        Args:
            request_id: unique among unfinished requests.
            prompt_token_ids: the prompt.
            params: sampling parameters.
            priority: lower runs first under the "priority" policy.
            prior_output_token_ids: output a previous run already emitted (resumption):
                a list of tokens for n == 1, or one list per choice for n > 1.

        Raises:
            ValueError: naming the field and the limit, for input the engine cannot serve.
        """
        if request_id in self.live.children:
            raise ValueError(f"request_id {request_id!r} is already running")
        check_priority(priority)
        check_prompt(prompt_token_ids, params, self.max_model_len, self.vocab_size)
        ids = []
        constrained: list[Request] = []
        for request in choices_of(request_id, prompt_token_ids, params, prior_output_token_ids, priority,
                                  self.eos_token_ids, self.max_model_len):  # fmt: skip
            detokenizer = make_detokenizer(
                self._token_decoder, request.prompt_token_ids, params.stop, params.skip_special_tokens
            )
            self.live.add(request, detokenizer, reads_history=reads_history(params))
            if params.structured_output is None:
                self.scheduler.add_request(request)
            else:
                constrained.append(request)
            ids.append(request.request_id)
        self.live.children[request_id] = ids
        if constrained:  # scheduled once the grammar compiled (`_admit_compiled`)
            self.constrained.submit(constraint_key(params.structured_output), constrained)

    def _admit_compiled(self) -> list[RequestOutput]:
        """Requests whose grammar is now compiled go to the scheduler; those whose constraint failed end with
        an error naming its field, before any token."""
        idle = not self.scheduler.has_unfinished() and not self._in_flight
        ready, failed = self.constrained.poll(idle)
        for request in ready:
            self.scheduler.add_request(request)
        outputs = []
        for request, message in failed:
            self.scheduler.finish_request(request, FinishReason.ERROR, message)
            outputs.append(self.output_processor.finished_output(request, [], "", None))
        return outputs

    def abort_request(self, request_id: str) -> list[RequestOutput]:
        """Aborts every choice of the request, freeing its KV blocks now."""
        outputs = []
        for internal_id in self.live.children.get(request_id, []):
            request = self.requests.get(internal_id)
            if request is None or request.is_finished:
                continue
            self.scheduler.finish_request(request, FinishReason.ABORT)
            outputs.append(self.output_processor.finished_output(request, [], "", None))
        return outputs

    def has_unfinished_requests(self) -> bool:
        """True while any request runs or waits, or a launched step's tokens are still unread for a
        request that has not finished (an aborted request's last step needs no reading)."""
        if self.scheduler.has_unfinished() or self.constrained:
            return True
        return any(not s.request.is_finished for sched, _ in self._in_flight for s in sched.scheduled)

    # ---- the step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduling decision through the model; returns the outputs that became known.

        With async scheduling (see EngineConfig) that is the step launched by the previous call:
        this call schedules and launches its own step first, then reads the previous one's
        tokens while the device runs the new one. A request that finished in the previous step
        (EOS, a stop string) may already be in the new step: its extra token is dropped. The
        last call, with nothing left to schedule, only reads.

        A step whose launch or token read raises is run again one request at a time, and only the
        requests that fail alone finish with an error (see `_relaunch_alone`).
        """
        started = time.monotonic()
        outputs: list[RequestOutput] = []
        # speculation needs each request's newest token on the host: such a step reads every step in flight
        speculate = self.speculator is not None and self.speculator.wants_step(self.scheduler.num_running)
        overlap = self.async_scheduling and not self.live.sync_ids and not speculate
        if self.constrained:
            outputs += self._admit_compiled()
        if not overlap:
            outputs += self._collect()
        proposed = self.speculator.propose(self.scheduler.running) if speculate else []
        sched = self.scheduler.schedule()
        for request in proposed:  # the scheduled items hold the proposals the budget took
            request.proposed_token_ids = []
        self._num_steps += 1
        self._record(sched)
        if sched.is_empty:
            outputs += self._collect()
        else:
            try:
                launched = self.runner.launch(sched, prompt_logprobs=bool(self.live.prompt_logprob_ids))
            except Exception as exc:  # one request's failure must not fail the others: see _relaunch_alone
                logger.exception("step %d failed", self._num_steps)
                outputs += self._collect()  # the step before: no token of these requests stays pending
                outputs += self._relaunch_alone(sched, exc)
            else:
                self._launched(sched, launched)
                outputs += self._collect(keep=1 if overlap else 0)
        self.last_step.duration_s = time.monotonic() - started
        return outputs

    def _launched(self, sched: SchedulerOutput, launched: LaunchedStep) -> None:
        """The step is on the device: its tokens count as computed, its samples as pending."""
        for item in sched.scheduled:
            request = item.request
            request.num_computed_tokens += item.num_new_tokens
            if item.num_computed_tokens < request.num_prompt_tokens:
                self._num_prompt_computed += item.num_new_tokens
        for request in launched.requests:
            request.num_pending_tokens += 1
        self._in_flight.append((sched, launched))

    def _collect(self, keep: int = 0) -> list[RequestOutput]:
        """Reads the steps in flight, oldest first, all but the newest `keep` (waiting for their tokens),
        and turns them into outputs."""
        outputs: list[RequestOutput] = []
        while len(self._in_flight) > keep:
            sched, launched = self._in_flight.pop(0)
            try:
                result = launched.result()
            except Exception as exc:
                logger.exception("reading step %d's tokens failed", self._num_steps)
                # NOTE: a step launched after this one took its pending tokens from it on the device: none of
                # its work can be kept either. Every request goes back to where this step found it.
                later, self._in_flight = self._in_flight, []
                for step in [*reversed(later), (sched, launched)]:
                    self._roll_back(*step)
                outputs += self._relaunch_alone(sched, exc)
                continue
            block_size = self.block_manager.block_size
            for item in sched.scheduled:
                if item.proposed_token_ids:
                    continue  # its computed tokens are known once its proposals are verified: _keep_verified
                # Blocks that this step filled get their prefix hash now that their tokens are known. A step that
                # crosses no block boundary fills none (a decode step of 15 in 16 requests, with blocks of 16).
                start, end = item.num_computed_tokens, item.num_computed_tokens + item.num_new_tokens
                if end // block_size > start // block_size and not item.request.is_finished:
                    self.block_manager.cache_full_blocks(item.request, end)
            outputs += self.output_processor.process(result)
            if result.verified is not None:
                self.speculator.keep_verified(sched.scheduled, result.verified, self.block_manager)
        return outputs

    def _roll_back(self, sched: SchedulerOutput, launched: LaunchedStep) -> None:
        """Undoes `_launched` for a step whose tokens will never be read. A request preempted since keeps
        its 0 computed tokens (it recomputes from its tokens); its blocks' hashes were never set, as a
        step's blocks are hashed only once its tokens are read."""
        for request in launched.requests:
            request.num_pending_tokens -= 1
            if request.grammar is not None:  # its grammar may have taken this token ahead (async scheduling)
                request.grammar.drop_ahead()
        for item in sched.scheduled:
            request = item.request
            if request.num_computed_tokens > item.num_computed_tokens:
                if item.num_computed_tokens < request.num_prompt_tokens:
                    self._num_prompt_computed -= item.num_new_tokens
                request.num_computed_tokens = item.num_computed_tokens

    def _relaunch_alone(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        """After `sched` failed (its launch, or reading its tokens) with no token of its requests pending:
        runs each of its requests that still runs as a step of its own, read at once, and fails only
        those whose step fails alone. A step of one request fails it.

        NOTE: this rare path is synchronous (k launches and k reads for a step of k requests). Each
        request's own step is its share of the failed one (same tokens, same positions, same blocks: its
        KV slots are written again with the same values), so greedy and seeded requests go on exactly as
        if the step had not failed; the runner's partial state of the failed launch is discarded by
        ModelRunner.launch (block-table rows) or is never read (no token is pending from it)."""
        running = [item for item in sched.scheduled if item.request.status is RequestStatus.RUNNING]
        if len(running) <= 1:
            return self._fail(running, f"{type(exc).__name__}: {exc}")
        outputs: list[RequestOutput] = []
        for item in running:
            if item.request.status is not RequestStatus.RUNNING:
                continue
            alone = SchedulerOutput([item])
            try:
                launched = self.runner.launch(alone, prompt_logprobs=bool(self.live.prompt_logprob_ids))
            except Exception as alone_exc:
                logger.warning("request %s fails a step of its own: %s", item.request.request_id, alone_exc)
                outputs += self._fail([item], f"{type(alone_exc).__name__}: {alone_exc}")
                continue
            self._launched(alone, launched)
            outputs += self._collect()  # a failed read comes back here with this one request, and fails it
        return outputs

    def _record(self, sched: SchedulerOutput) -> None:
        prefill = sum(s.num_new_tokens for s in sched.scheduled if s.num_new_tokens > 1 and not s.proposed_token_ids)
        self.last_step = StepRecord(
            step=self._num_steps,
            scheduled={s.request.request_id: s.num_new_tokens for s in sched.scheduled},
            new_request_ids=list(sched.new_request_ids),
            preempted_request_ids=list(sched.preempted_request_ids),
            num_prefill_tokens=prefill,
            num_decode_tokens=sched.num_scheduled_tokens - prefill,
        )

    def _fail(self, items: list[ScheduledRequest], message: str) -> list[RequestOutput]:
        outputs = []
        for item in items:
            request = item.request
            if request.is_finished:
                continue
            self.scheduler.finish_request(request, FinishReason.ERROR, message)
            outputs.append(self.output_processor.finished_output(request, [], "", None))
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return outputs

    # ---- counters ------------------------------------------------------------------
    def close(self) -> None:
        """Stops the grammar compiler's threads and the other ranks of a tensor-parallel group; the engine serves
        no further step."""
        self.constrained.shutdown()
        if self.rank_group is not None:
            self.runner.close()
            self.rank_group.close()
            self.rank_group = None

    def stats(self) -> EngineStats:
        bm = self.block_manager
        spec = self.speculator.stats if self.speculator is not None else None
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            block_size=bm.block_size,
            kv_usage=bm.usage,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            num_preemptions=self.scheduler.num_preemptions,
            num_generated_tokens=self.output_processor.num_generated,
            num_prompt_tokens_computed=self._num_prompt_computed,
            num_steps=self._num_steps,
            spec_num_drafts=spec.num_drafts if spec else 0,
            spec_num_draft_tokens=spec.num_draft_tokens if spec else 0,
            spec_num_accepted_tokens=spec.num_accepted_tokens if spec else 0,
            spec_accepted_per_position=tuple(spec.accepted_per_position) if spec else (),
        )
