"""Runs one scheduler decision through the model: stages the flat batch in pinned buffers,
runs the model (a CUDA graph for decode steps and small mixed steps on the GPU), picks the
last position of each sampling request, samples.

Legend: T = tokens scheduled in the step, S = sequences, V = vocabulary.

Per step the host does: one pass over the scheduled items into numpy views of pinned
buffers (engine/input_batch.py), one kernel that reads them into the device's, one graph
replay or eager forward, the LM head and sampling launches (both inside the replay for a
graphed step whose every sampling row is plain greedy, the LM head alone for small decode
batches: engine/cuda_graphs.py),
one kernel that writes the sampled tokens into a pinned buffer (engine/sample_readback.py), and ONE device
sync (reading them, in `LaunchedStep.result()`) for batches where no request asks for logprobs (greedy in
one kernel, sampling with temperature, top-k/p, min-p on the device). `launch` returns before
that sync, so the engine can stage and launch the next step while the device still runs this
one (async scheduling, engine/llm_engine.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine import attention_ops, ops
from engine.attention_metadata import AttentionMetadata
from engine.cuda_graphs import GraphOutputs, StepGraphs
from engine.input_batch import InputBatch, StepInputs
from engine.kv_cache import (
    DEFAULT_CPU_KV_TOKENS,
    KVCacheSpec,
    allocate_kv_cache,
    num_blocks_for_tokens,
    num_blocks_from_free_memory,
    reserve_activation_room,
)
from engine.launched_step import LaunchedStep, ModelRunnerOutput, SampledTokens, timer_hook
from engine.parallel.group import SINGLE, RankGroupBroken, TensorParallel, group_broken
from engine.parallel.step_mirror import StepHeader, StepMirror
from engine.prompt_logprobs import PromptChunk, step_prompt_logprobs
from engine.request import Request
from engine.sample_readback import SampleReadback
from engine.sampler import Sampler, only_chooses
from engine.scheduler import SchedulerOutput
from engine.spec_verify import verify_chosen, verify_step
from engine.step_timer import StepTimer
from engine.verify_rows import as_decode_rows

logger = logging.getLogger(__name__)

STEP_GRAPHS = ("capture", "eager", "off")  # ModelRunner's step_graphs


class ModelRunner:
    """Owns the model, the KV pool, the step's input buffers, the CUDA graphs and the sampler.

    Args:
        model: a model with the interface of engine/models (forward, compute_logits,
            num_layers, num_kv_heads, head_dim).
        device: where it runs.
        dtype: the KV cache dtype (the model's).
        block_size: tokens per KV block.
        num_kv_tokens: pool size in tokens; None sizes it from free GPU memory (CUDA)
            or takes DEFAULT_CPU_KV_TOKENS (CPU).
        gpu_memory_utilization: see CacheConfig.
        max_num_batched_tokens, max_num_seqs: the largest step (buffers, warm-up, graph buckets).
        max_model_len: the longest sequence (block-table width); None allows the whole pool.
        step_graphs: how decode steps and small mixed steps run on CUDA (engine/cuda_graphs.py):
            "capture" replays CUDA graphs of their buckets, captured at start; "eager" pads them to
            the same buckets and runs them eagerly, each bucket once at start (enforce_eager: the
            kernels its steps take are built then); "off" runs every step at its own size (the
            torch-reference kernels: they read lengths on the host, where a padded step has placeholders).
            CPU runs every step at its own size, except "eager" with the Triton kernels (the interpreter).
        tp: the tensor-parallel rank this runner serves (engine/parallel): every rank builds the same runner;
            rank 0's `launch` sends each step's forward to the others (engine/parallel/follower.py runs it there).
        num_speculative_tokens: k, the most proposed tokens a sequence verifies in a step (0: no speculation).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int,
        num_kv_tokens: int | None,
        gpu_memory_utilization: float,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        *,
        max_model_len: int | None = None,
        step_graphs: str = "off",
        tp: TensorParallel = SINGLE,
        num_speculative_tokens: int = 0,
    ) -> None:
        if step_graphs not in STEP_GRAPHS:
            raise ValueError(f"step_graphs must be one of {STEP_GRAPHS}, got {step_graphs!r}")
        self.model = model
        self.device = device
        self.block_size = block_size
        self.sampler = Sampler()
        self.spec = KVCacheSpec(model.num_layers, model.num_kv_heads, model.head_dim, block_size, dtype)
        warm_up_peak = None  # torch's reserved peak of the warm-up forward, where the pool is sized from it
        if num_kv_tokens is None and device.type == "cuda":
            self._warm_up(max_num_batched_tokens, max_num_seqs)
            self.num_blocks = num_blocks_from_free_memory(self.spec, device, gpu_memory_utilization)
            warm_up_peak = torch.cuda.max_memory_reserved(device)
        else:
            self.num_blocks = num_blocks_for_tokens(num_kv_tokens or DEFAULT_CPU_KV_TOKENS, block_size)
        self.num_blocks = tp.min_over_ranks(self.num_blocks)  # every rank's pool holds the same blocks
        self.kv_cache = allocate_kv_cache(self.spec, self.num_blocks, device)
        self.kv_caches = list(self.kv_cache.unbind(0))  # per layer [2, N, B, Hkv, D]
        width = self.num_blocks if max_model_len is None else -(-max_model_len // block_size)
        self.max_decode_batch = min(max_num_seqs, max_num_batched_tokens)
        # a verification step's decode rows store up to k + 1 keys of one sequence before its attention reads them
        self.inputs = InputBatch(max_num_batched_tokens, max_num_seqs, min(width, self.num_blocks), block_size, device,
                                 num_fresh_keys=1 + num_speculative_tokens)  # fmt: skip
        self.tp = tp
        self.mirror = StepMirror(tp, self.inputs) if tp.enabled else None
        self.graphs: StepGraphs | None = None
        self.timer: StepTimer | None = None  # benchmarks set one to time each step
        self._last_sampled: SampledTokens | None = None  # the last launched step's tokens, on the device
        self._last_read: Callable[[], ModelRunnerOutput] | None = None  # ... and their read on the host
        self.readback = SampleReadback(max_num_seqs, device)
        self.num_verified_as_rows = 0  # verification steps staged as decode rows (engine/verify_rows.py)
        if step_graphs != "off" and device.type == "cuda":
            self.enable_graphs(capture=step_graphs == "capture")
        elif step_graphs == "eager" and ops.get_kernel_backend() == "triton":
            # the Triton kernels on the CPU interpreter: the padded buckets run eagerly, as an enforce_eager GPU
            # engine's do (tests of the buckets through every rank of a tensor-parallel group)
            self.enable_graphs(capture=False)
        if device.type == "cuda":
            self._warm_up_sampling()
        if warm_up_peak is not None:
            kv_bytes = self.kv_cache.numel() * self.kv_cache.element_size()
            reserve_activation_room(device, warm_up_peak + kv_bytes)

    def enable_graphs(self, capture: bool) -> None:
        """Pads decode steps and small mixed steps to buckets over static buffers and, on CUDA, runs each
        bucket once now; capture=True records CUDA graphs.

        capture=False runs the same padded forward eagerly: an enforce_eager engine on CUDA, and how CPU
        tests check the bucketing and padding that the graphs rely on.
        """
        self.graphs = StepGraphs(
            self.forward,
            self.inputs,
            self.max_decode_batch,
            self.inputs.max_num_tokens,
            capture=capture,
            head=lambda hidden: self.model.compute_logits(hidden, widen=False),
            greedy=ops.greedy_sample,
        )
        self.graphs.build()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The model over one step; a captured graph replays this (the decode order's sort included)."""
        meta.decode_order = attention_ops.decode_order(meta, self.spec.num_kv_heads)
        return self.model(input_ids, positions, self.kv_caches, meta)

    # ---- warm-up --------------------------------------------------------
    @torch.inference_mode()
    def _warm_up(self, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        """One forward at the largest step, over a throwaway pool, so the peak is known."""
        num_tokens = max_num_batched_tokens
        num_seqs = min(max_num_seqs, num_tokens)
        lens = [num_tokens // num_seqs] * num_seqs
        lens[-1] += num_tokens - sum(lens)
        # NOTE: counted per sequence: with blocks longer than a sequence, num_tokens / block_size
        # blocks are too few (each sequence starts a block of its own)
        num_blocks = sum(-(-n // self.block_size) for n in lens) + 1
        scratch = allocate_kv_cache(self.spec, num_blocks, self.device)
        caches = list(scratch.unbind(0))
        meta, positions = self._prefill_metadata(lens)
        input_ids = torch.randint(0, 100, (num_tokens,), device=self.device)
        hidden = self.model(input_ids, positions, caches, meta)
        last = meta.query_start_loc[1:].long() - 1
        logits = self.model.compute_logits(hidden[last])
        torch.softmax(logits, dim=-1).sort(dim=-1)
        del scratch, caches, hidden, logits
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def _warm_up_sampling(self) -> None:
        """The sampler's kernels (Sampler.warm_up) and the tokens' hand-back into the pinned buffer
        (kernels/write_to_host.py), built while the engine starts, not inside the first steps it serves.

        NOTE: the warm-up forward and the graph capture run neither; without this, a fresh worker (empty
        Triton cache) built them inside its first sampled steps (decision 0009).
        tests/engine/test_compiles_after_start.py serves varied steps after start and fails on any variant
        built then."""
        if self.readback.host is None or not ops.use_triton(torch.empty(0, device=self.device)):
            return
        hidden = torch.zeros((1, self.model.config.hidden_size), dtype=self.spec.dtype, device=self.device)
        logits = self.model.compute_logits(hidden, widen=False)  # [1, V] as a step's logits are
        for packed in self.sampler.warm_up(logits):
            self.readback.warm_up(packed)
        torch.cuda.synchronize(self.device)

    def _prefill_metadata(self, lens: list[int]) -> tuple[AttentionMetadata, torch.Tensor]:
        """Metadata for fresh sequences laid out one after another in the pool (warm-up only)."""
        slots, tables, positions, starts = [], [], [], [0]
        next_block = 0
        max_blocks = max(-(-n // self.block_size) for n in lens)
        for n in lens:
            blocks = list(range(next_block, next_block + -(-n // self.block_size)))
            next_block += len(blocks)
            tables.append(blocks + [0] * (max_blocks - len(blocks)))
            slots.extend(blocks[p // self.block_size] * self.block_size + p % self.block_size for p in range(n))
            positions.extend(range(n))
            starts.append(starts[-1] + n)

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            block_tables=tensor(tables, torch.int32),
            seq_lens=tensor(lens, torch.int32),
            query_start_loc=tensor(starts, torch.int32),
            max_query_len=max(lens),
            max_seq_len=max(lens),
            seq_lens_cpu=lens,
            query_lens_cpu=lens,
        )
        return meta, tensor(positions, torch.int64)

    # ---- one step -------------------------------------------------------
    def launch(self, sched: SchedulerOutput, *, prompt_logprobs: bool = False) -> LaunchedStep:
        """Stages the step, queues its forward pass and sampling on the device and returns without
        waiting for them; `LaunchedStep.result()` reads the tokens.

        prompt_logprobs: some request computes prompt logprobs (the engine knows): the step's chunks of such
        requests get them from the hidden states, here, before returning (it waits for the device).

        NOTE: a decode row whose token the host has not read yet (async scheduling: sampled by
        the step launched just before this one) takes it from that step's device tensor. The
        caller reads each step's result before launching the step after the next one (two
        steps in flight at most: the host buffers the tokens arrive in alternate).
        """
        sent = self.mirror.num_sent if self.mirror is not None else 0
        try:
            return self._launch(sched, prompt_logprobs)
        except BaseException as exc:
            self.inputs.invalidate_tables()  # the device's block table may not hold what the host recorded
            if self.mirror is not None and self.mirror.num_sent > sent and not isinstance(exc, RankGroupBroken):
                # the other ranks run this step's forward too: after a failure here their collectives and this
                # rank's no longer pair up, so the group cannot serve another step
                raise group_broken(f"rank 0 failed a step the other ranks started: {exc!r}") from exc
            raise

    def close(self) -> None:
        """Rank 0: tells the other ranks to leave `follow_steps` (the engine is closing)."""
        if self.mirror is not None and self.tp.rank == 0:
            self.mirror.send(StepHeader("stop"))

    @torch.inference_mode()
    def _launch(self, sched: SchedulerOutput, prompt_logprobs: bool) -> LaunchedStep:
        clock = self.timer.begin() if self.timer is not None else None
        items = sched.scheduled
        num_tokens = sched.num_scheduled_tokens
        # a step that verifies proposed tokens runs as decode rows where every item decodes (engine/verify_rows.py),
        # else as a mixed step (more tokens than sequences) whose k + 1 rows a verifying sequence sample outside
        # the bucket's graph
        verifies = any(item.proposed_token_ids for item in items)
        rows = as_decode_rows(items, self.inputs.max_num_seqs) if verifies else None
        staged = rows.rows if rows is not None else items
        num_staged = len(staged) if rows is not None else num_tokens
        bucket = self.graphs.bucket_for(num_staged, len(staged)) if self.graphs is not None else None
        step = self.inputs.prepare(staged, num_staged, pad_to=bucket, pending=self._last_sampled,
                                   token_ids=rows.token_ids if rows is not None else None)  # fmt: skip
        if rows is not None:  # the sampling rows' items, as a mixed step's are
            self.num_verified_as_rows += 1
            step.sampling = [rows.item_of_row[row] for row in step.sampling]
        requests = [items[i].request for i in step.sampling]
        greedy = all(map(_is_plain_greedy, requests))
        if clock is not None:
            clock.launching()
        if bucket is not None:
            # the greedy graph's tokens are the sampling rows in order: a mixed bucket gathers them, a decode
            # bucket takes its first S rows, so there only where every row samples (a verifying mixed step has
            # more rows than its bucket's graph gathers)
            rows_in_order = bucket[0] != bucket[1] or step.logits_rows is None
            graph_greedy = greedy and bool(requests) and rows_in_order and (not verifies or rows is not None)
            if self.mirror is not None:
                self.mirror.send_step(step, bucket, graph_greedy)
            out = self.graphs.run(bucket, greedy=graph_greedy)
        else:
            if self.mirror is not None:
                self.mirror.send_step(step, None, False)
            out = GraphOutputs(self.forward(step.input_ids, step.positions, step.meta))  # [T, H]
        on_done = timer_hook(self.timer, clock, len(items), num_tokens, bucket is not None, sum(step.meta.seq_lens_cpu))
        prompt_chunks = step_prompt_logprobs(self.model, out.hidden, items) if prompt_logprobs else []
        if verifies:
            if out.tokens is not None:  # decode rows, every one plain greedy: the graph chose them
                result = verify_chosen(out.tokens, items, step.sampling)
            else:
                result = verify_step(self.sampler, self._logits(out, step), items, step.sampling, greedy=greedy)
            result.prompt_logprobs = prompt_chunks
            self._last_sampled = None  # a verifying step is read before the next one is scheduled
            if clock is not None:
                clock.launched()
            return LaunchedStep(result.requests, lambda: result, on_done)
        if not requests:
            self._last_sampled = self._last_read = None
            if clock is not None:
                clock.launched()
            return LaunchedStep([], _with_prompt_chunks(_nothing_sampled, prompt_chunks), on_done)
        self._catch_up_grammars(requests)
        if out.tokens is not None:  # the graph sampled: [2, b], rows 0..S-1 are the requests'
            token_ids, read = self.readback.read_later(out.tokens, requests)
        else:
            logits = self._logits(out, step)  # [S, V] in the model's dtype
            if greedy:
                # argmax and the finiteness check in one kernel on CUDA
                token_ids, read = self.readback.read_later(ops.greedy_sample(logits), requests)
            elif not any(r.sampling_params.logprobs is not None for r in requests):
                # temperature, top-k/p, min-p (one kernel on CUDA), bias, min_tokens: read a step later
                token_ids, read = self.readback.read_later(self.sampler.sample_packed(logits, requests), requests)
            else:
                sampled = self.sampler(logits, requests)  # NOTE: syncs (logprobs are built on the host)
                token_ids = torch.tensor(sampled.token_ids, dtype=torch.int64, device=self.device)
                result = ModelRunnerOutput(requests, sampled.token_ids, sampled.logprobs, sampled.errors)
                read = lambda: result  # noqa: E731
        self._last_sampled, self._last_read = SampledTokens(token_ids, requests), read
        if clock is not None:
            clock.launched()
        return LaunchedStep(requests, _with_prompt_chunks(read, prompt_chunks), on_done)

    def _catch_up_grammars(self, requests: list[Request]) -> None:
        """Async scheduling with structured output: a constrained request's previous token is still pending
        when this step samples, and its grammar must take it before it can fill this step's mask. The forward
        pass is already queued, so the host reads the previous step's tokens (an event recorded behind that
        step's sampling, not behind this forward) and advances the grammars while the device computes; the
        output processor later finds those tokens already taken (GrammarState.accept_ahead)."""
        if self._last_read is None or not any(r.grammar is not None and r.num_pending_tokens for r in requests):
            return
        previous = self._last_read()
        for request, token, error in zip(previous.requests, previous.token_ids, previous.errors, strict=True):
            if request.grammar is not None and request.num_pending_tokens and error is None and not request.is_finished:
                request.grammar.accept_ahead(token)

    def _logits(self, out: GraphOutputs, step: StepInputs) -> torch.Tensor:
        """The sampling rows' logits [S, V] in the model's dtype (LMHead widen=False: greedy and the sampling
        kernel widen each value themselves, the Sampler's torch path its rows), from the graph's LM head
        where it ran one, else from the hidden states."""
        if out.logits is not None:
            return _sampling_rows(out.logits, step)
        return self.model.compute_logits(_sampling_rows(out.hidden, step), widen=False)


def _sampling_rows(rows: torch.Tensor, step: StepInputs) -> torch.Tensor:
    """The rows of a step's hidden states or logits that sample: the first S of a decode step, else logits_rows."""
    return rows[: step.num_seqs] if step.logits_rows is None else rows[step.logits_rows]


def _nothing_sampled() -> ModelRunnerOutput:
    return ModelRunnerOutput([], [], [], [])


def _with_prompt_chunks(
    read: Callable[[], ModelRunnerOutput], chunks: list[PromptChunk]
) -> Callable[[], ModelRunnerOutput]:
    """`read`, its output carrying the step's prompt logprobs (the same `read` where there are none)."""
    if not chunks:
        return read

    def read_with_chunks() -> ModelRunnerOutput:
        output = read()
        output.prompt_logprobs = chunks
        return output

    return read_with_chunks


def _is_plain_greedy(request: Request) -> bool:
    """Greedy with nothing that changes the logits first (penalties, bias, min_tokens) and no logprobs."""
    p = request.sampling_params
    return p.is_greedy and p.logprobs is None and only_chooses(request)
