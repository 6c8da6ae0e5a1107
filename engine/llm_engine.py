"""LLMEngine: requests in, one scheduler decision + one forward + one sampling per
`step()`, text deltas out. Synchronous; the worker and the offline `LLM` drive it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import torch

from engine import ops
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.model_loader import load_model
from engine.model_runner import ModelRunner, ModelRunnerOutput
from engine.outputs import EngineStats, RequestOutput, StepRecord
from engine.request import FinishReason, Request
from engine.sampling_params import MAX_SEED, SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.tokenizer import (
    apply_chat_template,
    eos_token_ids,
    fast_decoder,
    load_generation_config,
    load_tokenizer,
)

logger = logging.getLogger(__name__)

_GOLDEN = 0x9E3779B97F4A7C15


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def child_seed(seed: int, index: int) -> int:
    """Choice i of an n > 1 request gets its own stream, still a function of the seed."""
    return seed if index == 0 else (seed + index * _GOLDEN) % (MAX_SEED + 1)


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
        started = time.monotonic()
        loaded = load_model(config.model, self.device, self.dtype, cache_dir=cache_dir)
        self.model = loaded.model
        self.hf_config = loaded.hf_config
        self.model_dir = loaded.model_dir
        self.max_model_len = loaded.max_model_len
        self.vocab_size = int(self.hf_config.vocab_size)
        self.tokenizer = load_tokenizer(self.model_dir)
        self._token_decoder = fast_decoder(self.tokenizer)
        generation_config = load_generation_config(self.model_dir)
        self.eos_token_ids = frozenset(eos_token_ids(self.hf_config, generation_config, self.tokenizer))
        sched = config.scheduler
        self.runner = ModelRunner(
            self.model,
            self.device,
            self.dtype,
            block_size=config.cache.block_size,
            num_kv_tokens=config.cache.num_kv_tokens,
            gpu_memory_utilization=config.cache.gpu_memory_utilization,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            max_num_seqs=sched.max_num_seqs,
            max_model_len=self.max_model_len,
            # NOTE: the torch-reference kernels read sequence lengths on the host, which a graph would freeze.
            cuda_graphs=not config.enforce_eager and config.kernels != "torch",
        )
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching
        )
        self.scheduler = Scheduler(sched, self.block_manager)
        self.requests: dict[str, Request] = {}  # internal id -> request
        self._children: dict[str, list[str]] = {}  # caller's id -> internal ids
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.last_step = StepRecord()
        self._num_steps = 0
        self._num_generated = 0
        self._num_prompt_computed = 0
        logger.info(
            "engine ready: %s on %s (%s), max_model_len %d, %.1fs",
            self.model_dir,
            self.device,
            self.dtype,
            self.max_model_len,
            time.monotonic() - started,
        )

    # ---- tokenization -------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return apply_chat_template(self.tokenizer, messages)

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
        if request_id in self._children:
            raise ValueError(f"request_id {request_id!r} is already running")
        self._validate_prompt(prompt_token_ids, params)
        priors = self._split_priors(prior_output_token_ids, params.n)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        ids = []
        for index in range(params.n):
            internal_id = request_id if params.n == 1 else f"{request_id}#{index}"
            prior = priors[index]
            request = Request(
                request_id=internal_id,
                prompt_token_ids=list(prompt_token_ids) + prior,
                sampling_params=params,
                eos_token_ids=self.eos_token_ids,
                priority=priority,
                seed=child_seed(seed, index),
                num_prior_output_tokens=len(prior),
                parent_id=request_id if params.n > 1 else None,
                choice_index=index,
            )
            self.requests[internal_id] = request
            self._detokenizers[internal_id] = IncrementalDetokenizer(
                self._token_decoder, request.prompt_token_ids, params.stop, params.skip_special_tokens
            )
            self.scheduler.add_request(request)
            ids.append(internal_id)
        self._children[request_id] = ids

    def _validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("prompt must hold at least one token")
        if n >= self.max_model_len:
            raise ValueError(
                f"prompt is {n} tokens, but max_model_len is {self.max_model_len} "
                "(the prompt must leave room for at least one output token)"
            )
        if params.max_tokens is not None and n + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"max_tokens ({params.max_tokens}) plus the prompt ({n} tokens) exceeds "
                f"max_model_len ({self.max_model_len})"
            )
        for i, token in enumerate(prompt_token_ids):
            if not isinstance(token, int) or not 0 <= token < self.vocab_size:
                raise ValueError(f"prompt_token_ids[{i}] = {token!r} is outside the vocabulary [0, {self.vocab_size})")

    @staticmethod
    def _split_priors(prior: list[int] | list[list[int]] | None, n: int) -> list[list[int]]:
        if not prior:
            return [[] for _ in range(n)]
        if n == 1 and all(isinstance(t, int) for t in prior):
            return [list(prior)]  # type: ignore[arg-type]
        if len(prior) != n or not all(isinstance(p, list) for p in prior):
            raise ValueError(f"prior_output_token_ids must hold one list per choice (n = {n})")
        return [list(p) for p in prior]  # type: ignore[arg-type]

    def abort_request(self, request_id: str) -> list[RequestOutput]:
        """Aborts every choice of the request, freeing its KV blocks now."""
        outputs = []
        for internal_id in self._children.get(request_id, []):
            request = self.requests.get(internal_id)
            if request is None or request.is_finished:
                continue
            self.scheduler.finish_request(request, FinishReason.ABORT)
            outputs.append(self._finished_output(request, [], "", None))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ---------------------------------------------------------------
    def step(self, during_forward: Callable[[], None] | None = None) -> list[RequestOutput]:
        """One scheduling decision through the model; returns this step's outputs.

        during_forward: called once the step's GPU work is launched and before the host waits for
            it, so that a caller's own I/O (the worker's Redis reads) overlaps the forward pass.
            It must not touch this engine (the step is half done); on CPU it runs after the forward.
        """
        started = time.monotonic()
        sched = self.scheduler.schedule()
        self._num_steps += 1
        self._record(sched)
        if sched.is_empty:
            return []
        try:
            result = self.runner.execute(sched, during_forward)
        except Exception as exc:  # a failing forward fails its step's requests, never the engine
            logger.exception("step %d failed", self._num_steps)
            return self._fail_step(sched, f"{type(exc).__name__}: {exc}")
        for item in sched.scheduled:
            request = item.request
            request.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(request, request.num_computed_tokens)
            if item.num_computed_tokens < request.num_prompt_tokens:
                self._num_prompt_computed += item.num_new_tokens
        outputs = self._process(result)
        self.last_step.duration_s = time.monotonic() - started
        return outputs

    def _record(self, sched: SchedulerOutput) -> None:
        prefill = sum(s.num_new_tokens for s in sched.scheduled if s.num_new_tokens > 1)
        self.last_step = StepRecord(
            step=self._num_steps,
            scheduled={s.request.request_id: s.num_new_tokens for s in sched.scheduled},
            new_request_ids=list(sched.new_request_ids),
            preempted_request_ids=list(sched.preempted_request_ids),
            num_prefill_tokens=prefill,
            num_decode_tokens=sched.num_scheduled_tokens - prefill,
        )

    def _fail_step(self, sched: SchedulerOutput, message: str) -> list[RequestOutput]:
        outputs = []
        for item in sched.scheduled:
            request = item.request
            self.scheduler.finish_request(request, FinishReason.ERROR, message)
            outputs.append(self._finished_output(request, [], "", None))
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return outputs

    def _process(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        outputs = []
        for request, token, logprob, error in zip(
            result.requests, result.token_ids, result.logprobs, result.errors, strict=True
        ):
            if error is not None:
                self.scheduler.finish_request(request, FinishReason.ERROR, error)
                outputs.append(self._finished_output(request, [], "", None))
                continue
            self._num_generated += 1
            request.append_token(token)
            if logprob is not None:
                request.output_logprobs.append(logprob)
            reason = self._stop_by_token(request, token)
            detok = self._detokenizers[request.request_id]
            text = detok.add_tokens([token]) if reason is not FinishReason.STOP else ""
            if detok.stopped:
                reason = FinishReason.STOP
            elif reason is None:
                reason = self._stop_by_length(request)
            new_logprobs = [logprob] if logprob is not None else None
            if reason is None:
                outputs.append(self._output(request, [token], text, new_logprobs, False))
                continue
            if not detok.stopped:
                text += detok.flush()
            self.scheduler.finish_request(request, reason)
            outputs.append(self._finished_output(request, [token], text, new_logprobs))
        return outputs

    def _stop_by_token(self, request: Request, token: int) -> FinishReason | None:
        params = request.sampling_params
        if request.num_output_tokens <= params.min_tokens:
            return None
        if token in params.stop_token_ids or (not params.ignore_eos and token in request.eos_token_ids):
            return FinishReason.STOP
        return None

    def _stop_by_length(self, request: Request) -> FinishReason | None:
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None and request.num_output_tokens >= max_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    # ---- outputs ------------------------------------------------------------------
    def _output(
        self, request: Request, tokens: list[int], text: str, logprobs: list | None, finished: bool
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request.parent_id or request.request_id,
            index=request.choice_index,
            new_token_ids=tokens,
            new_text=text,
            new_logprobs=logprobs,
            finished=finished,
            finish_reason=request.finish_reason.value if request.finish_reason else None,
            num_prompt_tokens=request.num_prompt_tokens - request.num_prior_output_tokens,
            num_output_tokens=request.num_output_tokens,
            error=request.error,
        )

    def _finished_output(self, request: Request, tokens: list[int], text: str, logprobs: list | None) -> RequestOutput:
        out = self._output(request, tokens, text, logprobs, True)
        self._forget(request)
        return out

    def _forget(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self._detokenizers.pop(request.request_id, None)
        parent = request.parent_id or request.request_id
        siblings = self._children.get(parent, [])
        if all(sid not in self.requests for sid in siblings):
            self._children.pop(parent, None)

    # ---- counters ------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            block_size=bm.block_size,
            kv_usage=bm.usage,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            num_preemptions=self.scheduler.num_preemptions,
            num_generated_tokens=self._num_generated,
            num_prompt_tokens_computed=self._num_prompt_computed,
            num_steps=self._num_steps,
        )
