"""Graphs of small mixed steps (prefill chunks with or without decodes): padding and parity.

On the CPU the padded mixed path runs eagerly over the static buffers its graphs read
(StepGraphs with capture=False): padding tokens (slot -1), padding sequences (no new token,
seq_len 0), chunked prefill and cached prefixes are checked against the unpadded engine, with
the torch references and with the Triton prefill kernel under the interpreter. On a GPU,
tests/engine/test_cuda_graphs.py compares the captured graphs with enforce_eager.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.input_batch import InputBatch
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledRequest
from engine.step_timer import StepTimer
from tests.engine.engine_helpers import make_engine, mixed_sampling_params, random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory
from tests.engine.test_cuda_graphs import assert_same_outputs, run_with_logprobs

ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    return tiny_checkpoint_factory(request, tmp_path_factory)


class _FakeRequest:
    def __init__(self, tokens: list[int]) -> None:
        self.all_token_ids = tokens


def _batch() -> InputBatch:
    return InputBatch(max_num_tokens=64, max_num_seqs=8, max_blocks_per_seq=6, block_size=4, device=torch.device("cpu"))


def test_input_batch_pads_mixed_steps_to_their_bucket() -> None:
    batch = _batch()
    a, b = _FakeRequest(list(range(100, 112))), _FakeRequest(list(range(200, 206)))
    # a decodes its 7th token; b prefills tokens 2..5 over a cached prefix of 2
    items = [ScheduledRequest(a, 1, 6, [5, 2], True), ScheduledRequest(b, 4, 2, [7, 3], True)]
    step = batch.prepare(items, 5, pad_to=(16, 7))
    assert step.input_ids.tolist() == [106, 202, 203, 204, 205] + [0] * 11
    assert step.positions.tolist() == [6, 2, 3, 4, 5] + [0] * 11
    assert step.meta.slot_mapping.tolist() == [2 * 4 + 2, 7 * 4 + 2, 7 * 4 + 3, 3 * 4 + 0, 3 * 4 + 1] + [-1] * 11
    assert step.meta.seq_lens.tolist() == [7, 6, 0, 0, 0, 0, 0]
    # the padding sequences own no token: their starts all equal the real token count
    assert step.meta.query_start_loc.tolist() == [0, 1, 5, 5, 5, 5, 5, 5]
    assert step.logits_rows.tolist() == [0, 4] and step.sampling == [0, 1]
    # the bucket's greedy graph gathers one row per padded sequence: the step's, then row 0
    assert batch.mixed_sampling_rows(16, 7).tolist() == [0, 4, 0, 0, 0, 0, 0]
    assert step.meta.query_lens_cpu == [1, 4, 0, 0, 0, 0, 0]
    # The buffers the graph reads are these same views.
    ids, positions, meta = batch.mixed_views(16, 7)
    assert ids.data_ptr() == step.input_ids.data_ptr() and positions.data_ptr() == step.positions.data_ptr()
    assert meta.query_start_loc.data_ptr() == step.meta.query_start_loc.data_ptr()
    assert meta.slot_mapping.data_ptr() == step.meta.slot_mapping.data_ptr()
    assert meta.max_query_len == 16 and not meta.is_decode_only
    with pytest.raises(ValueError, match="cannot hold"):
        batch.prepare(items, 5, pad_to=(4, 3))  # fewer tokens than the step
    with pytest.raises(ValueError, match="cannot hold"):
        batch.prepare(items, 5, pad_to=(16, 1))  # fewer sequences than the step
    with pytest.raises(ValueError, match="one token per sequence"):
        batch.prepare(items, 5, pad_to=(8, 8))  # a decode bucket


def test_dummy_mixed_batch_spreads_tokens_over_its_sequences() -> None:
    batch = _batch()
    a, b = _FakeRequest(list(range(100, 112))), _FakeRequest(list(range(200, 206)))
    batch.prepare([ScheduledRequest(a, 1, 6, [5, 2], True), ScheduledRequest(b, 4, 2, [7, 3], True)], 5, pad_to=(16, 7))
    batch.fill_dummy_mixed(16, 7)
    assert batch.mixed_sampling_rows(16, 7).tolist() == [0] * 7  # the last step's rows [0, 4] are gone
    ids, positions, meta = batch.mixed_views(16, 7)
    assert meta.query_start_loc.tolist() == [0, 3, 6, 9, 12, 15, 16, 16]
    assert meta.seq_lens.tolist() == [3, 3, 3, 3, 3, 1, 0]
    assert meta.slot_mapping.tolist() == [-1] * 16  # writes no KV


def _workload(vocab_size: int) -> tuple[list[list[int]], list[int]]:
    """Staggered prompts: long ones that the 64-token budget chunks, and prompts sharing a
    40-token prefix (later ones hit the prefix cache: prefill over a cached prefix)."""
    rng = random.Random(3)
    prompts = random_prompts(6, vocab_size, 3, 100, seed=9)
    shared = [rng.randrange(100, vocab_size) for _ in range(40)]
    prompts += [shared + [rng.randrange(100, vocab_size) for _ in range(n)] for n in (5, 9, 17)]
    arrivals = [0, 0, 1, 3, 5, 8, 2, 9, 14]
    return prompts, arrivals


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
def test_padded_mixed_steps_match_the_plain_engine(
    kind: str, async_scheduling: bool, tiny_ckpt: Callable[[str], Path]
) -> None:
    model_dir = tiny_ckpt(kind)
    plain_engine = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=8)
    prompts, arrivals = _workload(plain_engine.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    plain = run_with_logprobs(plain_engine, prompts, params, arrivals)
    engine = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=8, async_scheduling=async_scheduling)
    engine.runner.enable_graphs(capture=False)
    engine.runner.timer = StepTimer(engine.device)
    assert_same_outputs(run_with_logprobs(engine, prompts, params, arrivals), plain, tol=1e-4)
    graphs = engine.runner.graphs
    mixed = [r for r in engine.runner.timer.records if r.graphed and r.num_tokens > r.num_seqs]
    assert graphs.num_mixed_replays == len(mixed) > 5
    assert {r.num_tokens for r in mixed} >= {64}  # a full chunk of a long prompt went through the 64 bucket
    assert any(r.num_tokens not in graphs.mixed_sizes for r in mixed)  # and smaller steps were padded up
    stats = engine.stats()
    assert stats.prefix_cache_hit_rate > 0  # the shared-prefix prompts prefilled over cached blocks
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's run of the kernels; on a GPU the graph tests cover it")
def test_padded_mixed_steps_through_the_triton_kernels(tiny_ckpt: Callable[[str], Path]) -> None:
    """The real prefill kernel (interpreted) with padding tokens and empty padding sequences."""
    model_dir = tiny_ckpt("llama")
    prompts = random_prompts(3, 49152, 5, 20, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    plain = run_staggered(make_engine(model_dir, max_num_batched_tokens=32), prompts, params, [0, 1, 2])
    engine = make_engine(model_dir, kernels="triton", max_num_batched_tokens=32)
    engine.runner.enable_graphs(capture=False)
    assert run_staggered(engine, prompts, params, [0, 1, 2]) == plain
    assert engine.runner.graphs.num_mixed_replays >= 2


@pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's run; test_cuda_graphs.py runs the kernels in a CUDA engine")
def test_seeded_sampling_through_the_sampling_kernel(tiny_ckpt: Callable[[str], Path], monkeypatch) -> None:
    """The sort-free sampling kernel (interpreted) in the engine: seeded rows with temperature, top-k,
    top-p and min-p, alone and together, beside a greedy row, give the torch engine's tokens."""
    from engine import ops

    model_dir = tiny_ckpt("llama")
    prompts = random_prompts(4, 49152, 5, 20, seed=5)
    params = mixed_sampling_params(max_tokens=8)
    plain = run_staggered(make_engine(model_dir), prompts, params, [0, 0, 1, 2])
    kernel_calls, step_0_asked = [], []
    real = ops.random_sample

    def spy(logits, params, rows_ask_step_0=False, masked=False):
        kernel_calls.append(ops.use_triton(logits))
        step_0_asked.append(rows_ask_step_0)
        return real(logits, params, rows_ask_step_0, masked)

    monkeypatch.setattr(ops, "random_sample", spy)
    engine = make_engine(model_dir, kernels="triton")
    assert run_staggered(engine, prompts, params, [0, 0, 1, 2]) == plain
    assert len(kernel_calls) >= 8 and all(kernel_calls)
    assert any(step_0_asked)  # the top-k + top-p row's steps took the radix select (step 0)
    assert len({t for tokens in plain.values() for t in tokens}) > 16  # sampled, not one repeated token
