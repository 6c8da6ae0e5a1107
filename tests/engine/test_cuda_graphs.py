"""Decode CUDA graphs: buckets, padding and static buffers.

On the CPU the padded decode path runs eagerly over the same static buffers the graphs
read (StepGraphs with capture=False), so bucketing, padding rows (slot -1, seq_len 0) and
the incremental block tables are checked against the unpadded engine token for token. On
a GPU the real graphs are captured and must give the same tokens as eager steps at their own
sizes; an enforce_eager engine's padded (uncaptured) steps too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.cuda_graphs import capture_sizes, mixed_capture_sizes
from engine.input_batch import InputBatch
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledRequest
from engine.step_timer import StepTimer
from tests.engine.engine_helpers import make_engine, mixed_sampling_params, random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory

ON_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA GPU")

# 11 requests arriving over time: decode batches of 1..11 rows cross the buckets 1, 2, 4, 8, 16.
ARRIVALS = [0, 0, 1, 2, 4, 6, 9, 12, 15, 19, 24]


def test_capture_sizes_are_vllm_buckets() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(256)[-1] == 256 and len(capture_sizes(256)) == 35
    with pytest.raises(ValueError, match="max_batch"):
        capture_sizes(0)


def test_the_engine_config_picks_how_small_steps_run() -> None:
    """Graphs by default; enforce_eager pads to the same buckets without capture; the torch-reference kernels
    read lengths on the host, so their steps run at their own size (engine.engine_setup.step_graphs)."""
    from engine.engine_setup import step_graphs as _step_graphs

    model = ModelConfig(model="unused")
    assert _step_graphs(EngineConfig(model=model)) == "capture"
    assert _step_graphs(EngineConfig(model=model, enforce_eager=True)) == "eager"
    assert _step_graphs(EngineConfig(model=model, kernels="torch")) == "off"
    assert _step_graphs(EngineConfig(model=model, kernels="torch", enforce_eager=True)) == "off"


def test_the_runner_names_the_step_modes_it_takes() -> None:
    from engine.model_runner import ModelRunner

    with pytest.raises(ValueError, match=r"step_graphs must be one of \('capture', 'eager', 'off'\), got 'graphs'"):
        ModelRunner(torch.nn.Identity(), torch.device("cpu"), torch.float32, 16, 64, 0.9, 64, 4, step_graphs="graphs")


@pytest.fixture(scope="module")
def tiny_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny checkpoints that need no GGUF conversion where the tokenizer was carried (GPU machine)."""
    return tiny_checkpoint_factory(request, tmp_path_factory)


def test_mixed_capture_sizes_stop_at_the_token_budget() -> None:
    assert mixed_capture_sizes(1) == []
    assert mixed_capture_sizes(2) == [2]
    assert mixed_capture_sizes(64) == [16, 32, 64]
    assert mixed_capture_sizes(100) == [16, 32, 64, 96, 100]
    small = [16, 32, 64, 96, 128, 192, 256, 384, 512]
    assert mixed_capture_sizes(1000) == [*small, 640, 768, 896, 1000]
    # the default budget: steps of 128 to 1,024, of 256 to 2,048, of 512 to 8,192 (padding at most a quarter, then
    # an eighth, of a step)
    large = [640, 768, 896, 1024, 1280, 1536, 1792, 2048, *range(2560, 8193, 512)]
    assert mixed_capture_sizes(8192) == [*small, *large]
    assert mixed_capture_sizes(16384) == [*small, *large]  # steps over 8,192 tokens run eagerly
    sizes = mixed_capture_sizes(8192)
    for smaller, larger in zip(sizes[8:], sizes[9:], strict=False):
        padded = larger - (smaller + 1)  # the most padding: a step one token over the smaller bucket
        assert padded / larger <= (0.25 if larger <= 2048 else 0.2)


def test_bucket_is_the_smallest_that_fits(tiny_ckpt: Callable[[str], Path]) -> None:
    engine = make_engine(tiny_ckpt("llama"), max_num_seqs=20, max_model_len=64)
    engine.runner.enable_graphs(capture=False)
    graphs = engine.runner.graphs
    # decode steps: one token per sequence
    decode = [graphs.bucket_for(n, n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 20)]
    assert decode == [(b, b) for b in (1, 2, 4, 8, 8, 16, 16, 20, 20)]
    assert graphs.bucket_for(21, 21) is None
    # mixed steps: the token bucket, and as many sequences as it can hold (at most max_num_seqs)
    assert graphs.bucket_for(2, 1) == (16, 15)  # fewer sequences than tokens: never a decode bucket
    assert graphs.bucket_for(17, 3) == (32, 20)
    assert graphs.bucket_for(512, 20) == (512, 20)
    assert graphs.bucket_for(513, 20) == (640, 20)
    # the largest bucket this engine's block table holds: 20 warm-up sequences of 64 tokens at most
    assert graphs.mixed_sizes[-1] == 1280 and graphs.bucket_for(1280, 20) == (1280, 20)
    assert graphs.bucket_for(1281, 20) is None  # longer steps run eagerly
    graphs.enabled = False
    assert graphs.bucket_for(1, 1) is None and graphs.bucket_for(16, 2) is None
    # Buckets whose warm-up sequences (T_b tokens over S_b of them) would overflow the block table are left out.
    narrow = make_engine(tiny_ckpt("llama"), max_num_seqs=2, max_model_len=64)
    narrow.runner.enable_graphs(capture=False)
    assert narrow.runner.graphs.mixed_sizes == [16, 32, 64, 96, 128]
    assert narrow.runner.graphs.bucket_for(129, 2) is None


class _FakeRequest:
    def __init__(self, tokens: list[int]) -> None:
        self.all_token_ids = tokens


def test_input_batch_pads_rows_and_keeps_block_tables_in_step() -> None:
    batch = InputBatch(
        max_num_tokens=64, max_num_seqs=8, max_blocks_per_seq=6, block_size=4, device=torch.device("cpu")
    )
    tables = [[5, 2], [7]]
    a, b = _FakeRequest(list(range(100, 112))), _FakeRequest(list(range(200, 203)))
    items = [ScheduledRequest(a, 1, 6, tables[0], True), ScheduledRequest(b, 1, 2, tables[1], True)]
    step = batch.prepare(items, 2, pad_to=(4, 4))
    assert step.input_ids.tolist() == [106, 202, 0, 0]
    assert step.positions.tolist() == [6, 2, 0, 0]
    assert step.meta.slot_mapping.tolist() == [2 * 4 + 2, 7 * 4 + 2, -1, -1]
    assert step.meta.seq_lens.tolist() == [7, 3, 0, 0]
    assert step.meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert step.meta.block_tables[:2, :2].tolist() == [[5, 2], [7, 0]]
    assert step.logits_rows is None and step.sampling == [0, 1]
    # Same requests, one grows a block: only the new block is written; a new request replaces row 1.
    tables[0].append(9)
    c = _FakeRequest(list(range(300, 320)))
    items = [ScheduledRequest(a, 1, 8, tables[0], True), ScheduledRequest(c, 3, 9, [4, 1, 3], True)]
    step = batch.prepare(items, 4)
    assert step.input_ids.tolist() == [108, 309, 310, 311]
    assert step.positions.tolist() == [8, 9, 10, 11]
    assert step.meta.slot_mapping.tolist() == [9 * 4 + 0, 3 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3]
    assert step.meta.block_tables[:2, :3].tolist() == [[5, 2, 9], [4, 1, 3]]
    assert step.meta.query_start_loc.tolist() == [0, 1, 4]
    assert step.logits_rows.tolist() == [0, 3]
    # A decode step where the second row is a one-token prompt chunk: it does not sample.
    items = [ScheduledRequest(a, 1, 9, tables[0], True), ScheduledRequest(c, 1, 12, [4, 1, 3, 6], False)]
    step = batch.prepare(items, 2, pad_to=(2, 2))
    assert step.sampling == [0] and step.logits_rows.tolist() == [0]
    assert step.meta.block_tables[1, :4].tolist() == [4, 1, 3, 6]
    with pytest.raises(ValueError, match="pad_to"):
        batch.prepare(items, 2, pad_to=(1, 1))
    # After a failed step the runner invalidates the rows: they are all rewritten and copied again.
    batch.block_tables.zero_()
    batch.invalidate_tables()
    step = batch.prepare(items, 2)
    assert step.meta.block_tables[:2, :4].tolist() == [[5, 2, 9, 0], [4, 1, 3, 6]]


def run_with_logprobs(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, arrivals: list[int]
) -> dict[str, list[tuple[int, float]]]:
    """Like run_staggered, but returns (token, its logprob) per request: logprobs see attention
    errors too small to flip a greedy token of the tiny models."""
    out: dict[str, list[tuple[int, float]]] = {f"r{i}": [] for i in range(len(prompts))}
    pending = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts[i], params)
        for o in engine.step():
            assert o.finish_reason in (None, "length"), o
            out[o.request_id].extend((lp.token_id, lp.logprob) for lp in o.new_logprobs or [])
        step += 1
    return out


def assert_same_outputs(ours: dict, reference: dict, tol: float) -> None:
    assert ours.keys() == reference.keys()
    for rid, expected in reference.items():
        assert [t for t, _ in ours[rid]] == [t for t, _ in expected], rid
        assert ours[rid] and all(abs(a - b) <= tol for (_, a), (_, b) in zip(ours[rid], expected)), rid


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
def test_padded_static_decode_matches_the_plain_engine(kind: str, tiny_ckpt: Callable[[str], Path]) -> None:
    model_dir = tiny_ckpt(kind)
    prompts = random_prompts(len(ARRIVALS), 49152, 3, 40, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True, logprobs=0)
    plain = run_with_logprobs(make_engine(model_dir, max_num_batched_tokens=64), prompts, params, ARRIVALS)
    engine = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=16, num_kv_tokens=2048)
    engine.runner.enable_graphs(capture=False)
    engine.runner.timer = StepTimer(engine.device)
    assert_same_outputs(run_with_logprobs(engine, prompts, params, ARRIVALS), plain, tol=1e-4)
    assert engine.runner.graphs.num_replays > 20
    graphed = [r for r in engine.runner.timer.records if r.graphed]
    sizes = {r.num_seqs for r in graphed}
    assert {1, 3, 5} <= sizes and max(sizes) > 8, sizes  # padded to 4, 8 and 16 rows
    assert all(r.host_s > 0 for r in engine.runner.timer.records)
    # The greedy fast path (no logprobs) picks the same tokens.
    greedy = SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True)
    tokens = run_staggered(engine, prompts, greedy, ARRIVALS)
    assert tokens == {rid: [t for t, _ in out] for rid, out in plain.items()}


def record_steps(engine) -> list[tuple[tuple[int, int] | None, int]]:
    """(bucket, sampling rows) of every step the engine's runner prepares from now on."""
    steps = []
    prepare = engine.runner.inputs.prepare

    def recording(scheduled, num_tokens, pad_to=None, pending=None, token_ids=None):
        step = prepare(scheduled, num_tokens, pad_to, pending, token_ids)
        steps.append((pad_to, len(step.sampling)))
        return step

    engine.runner.inputs.prepare = recording
    return steps


def mixed_sampling_steps(steps: list[tuple[tuple[int, int] | None, int]]) -> int:
    """Steps padded to a mixed bucket in which some request sampled."""
    return sum(1 for bucket, num_sampling in steps if bucket is not None and bucket[0] != bucket[1] and num_sampling)


def test_greedy_steps_sample_in_their_graphs_and_small_decode_buckets_end_in_the_lm_head(
    tiny_ckpt: Callable[[str], Path],
) -> None:
    """Plain greedy steps of every bucket, decode and mixed, replay the graph that ends in the greedy kernel;
    sampling steps take the LM head's logits from the graphs of decode buckets up to HEAD_MAX_ROWS rows and the
    hidden states from the others. Both give the plain engine's tokens."""
    model_dir = tiny_ckpt("llama")
    prompts = random_prompts(len(ARRIVALS), 49152, 3, 40, seed=7)
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=20, ignore_eos=True)
    plain = make_engine(model_dir, max_num_batched_tokens=64)
    want_greedy = run_staggered(plain, prompts, greedy, ARRIVALS)
    want_sampled = run_staggered(plain, prompts, sampled, ARRIVALS)
    engine = make_engine(model_dir, max_num_batched_tokens=64, max_num_seqs=16, num_kv_tokens=2048)
    engine.runner.enable_graphs(capture=False)
    graphs = engine.runner.graphs
    assert graphs.head_sizes == [1, 2, 4, 8]
    steps = record_steps(engine)
    assert run_staggered(engine, prompts, greedy, ARRIVALS) == want_greedy
    decode_replays = graphs.num_replays - graphs.num_mixed_replays
    token_replays, logits_replays = graphs.num_token_replays, graphs.num_logits_replays
    mixed_sampling = mixed_sampling_steps(steps)
    assert decode_replays > 10 and mixed_sampling > 3
    # every greedy decode step, the 16-row bucket's too, and every mixed step with a row to sample
    assert token_replays == decode_replays + mixed_sampling
    assert logits_replays == token_replays
    assert run_staggered(engine, prompts, sampled, ARRIVALS) == want_sampled
    assert graphs.num_token_replays == token_replays  # sampling never takes the greedy graph
    sampled_decodes = graphs.num_replays - graphs.num_mixed_replays - decode_replays
    # small buckets hand the sampler their logits; the 16-row bucket (9-11 rows) its hidden states
    assert logits_replays + 10 < graphs.num_logits_replays < logits_replays + sampled_decodes


@pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's run of the kernels; on a GPU the graph tests cover it")
def test_padded_decode_through_the_triton_kernels(tiny_ckpt: Callable[[str], Path]) -> None:
    """The real decode kernel (interpreted on the CPU) with padding rows of seq_len 0."""
    model_dir = tiny_ckpt("llama")
    prompts = random_prompts(3, 49152, 5, 20, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = run_staggered(make_engine(model_dir), prompts, params, [0, 0, 2])
    engine = make_engine(model_dir, kernels="triton")
    engine.runner.enable_graphs(capture=False)
    assert run_staggered(engine, prompts, params, [0, 0, 2]) == plain


def _cuda_engine(
    model_dir: Path,
    *,
    enforce_eager: bool,
    max_num_seqs: int = 16,
    async_scheduling: bool | None = None,
    kernels: str = "auto",
    max_num_batched_tokens: int = 256,
    num_kv_tokens: int = 4096,
) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(num_kv_tokens=num_kv_tokens),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
            device="cuda",
            enforce_eager=enforce_eager,
            async_scheduling=async_scheduling,
            kernels=kernels,
        )
    )


def _unpadded_eager_engine(model_dir: Path, **kwargs) -> LLMEngine:
    """The reference: enforce_eager with its bucket padding switched off, every step eager at its own size."""
    engine = _cuda_engine(model_dir, enforce_eager=True, **kwargs)
    assert engine.runner.graphs is not None and not engine.runner.graphs.capture  # enforce_eager never captures
    engine.runner.graphs.enabled = False
    return engine


@needs_gpu
@pytest.mark.parametrize("kind", ["llama", "llama3_tied", "mistral", "qwen2", "qwen3", "gpt2"])
def test_cuda_graphs_give_the_eager_tokens(kind: str, tiny_ckpt: Callable[[str], Path]) -> None:
    model_dir = tiny_ckpt(kind)
    prompts = random_prompts(len(ARRIVALS), 49152, 3, 60, seed=11)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    # The reference: eager and synchronous steps; the engine under test: graphs and async scheduling.
    eager_engine = _unpadded_eager_engine(model_dir, async_scheduling=False)
    eager = run_with_logprobs(eager_engine, prompts, with_logprobs, ARRIVALS)
    assert eager_engine.runner.graphs.num_replays == 0
    del eager_engine
    engine = _cuda_engine(model_dir, enforce_eager=False)
    assert engine.runner.graphs is not None and engine.runner.graphs.capture and engine.async_scheduling
    assert_same_outputs(run_with_logprobs(engine, prompts, with_logprobs, ARRIVALS), eager, tol=1e-4)
    replays = engine.runner.graphs.num_replays
    assert replays > 20
    assert engine.runner.graphs.num_mixed_replays > 0  # prompts arriving while others decode: mixed graphs
    graphs = engine.runner.graphs
    decodes_before, tokens_before = graphs.num_replays - graphs.num_mixed_replays, graphs.num_token_replays
    steps = record_steps(engine)
    tokens = run_staggered(engine, prompts, greedy, ARRIVALS)  # the greedy fast path after replays
    assert tokens == {rid: [t for t, _ in out] for rid, out in eager.items()}
    assert graphs.num_replays > replays + 20
    # every greedy decode step sampled inside its graph, the 16-row bucket's (9-11 rows) too, and every mixed
    # step with a row to sample (its rows gathered inside the graph)
    greedy_decodes = graphs.num_replays - graphs.num_mixed_replays - decodes_before
    mixed_sampling = mixed_sampling_steps(steps)
    assert greedy_decodes > 0 and mixed_sampling > 0
    assert graphs.num_token_replays - tokens_before == greedy_decodes + mixed_sampling


@needs_gpu
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_an_eager_engine_pads_its_steps_to_the_buckets(kind: str, tiny_ckpt: Callable[[str], Path]) -> None:
    """enforce_eager runs decode and small mixed steps padded to the graphs' buckets, uncaptured (so that
    their kernels are built at start: tests/engine/test_compiles_after_start.py), with the tokens of
    steps at their own sizes."""
    model_dir = tiny_ckpt(kind)
    prompts = random_prompts(len(ARRIVALS), 49152, 3, 60, seed=12)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    reference = run_with_logprobs(_unpadded_eager_engine(model_dir), prompts, with_logprobs, ARRIVALS)
    engine = _cuda_engine(model_dir, enforce_eager=True)
    assert_same_outputs(run_with_logprobs(engine, prompts, with_logprobs, ARRIVALS), reference, tol=1e-4)
    graphs = engine.runner.graphs
    assert not graphs.capture and graphs.num_replays > 20 and graphs.num_mixed_replays > 0
    assert graphs.num_token_replays == 0  # logprobs: every step samples outside the bucket's forward
    sampled = run_staggered(engine, prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), ARRIVALS)
    assert sampled == {rid: [t for t, _ in out] for rid, out in reference.items()}
    assert graphs.num_token_replays > 0  # plain greedy: small buckets' forwards end in the greedy kernel


@needs_gpu
def test_seeded_sampling_is_the_same_with_graphs(tiny_ckpt: Callable[[str], Path]) -> None:
    """Random sampling goes through the full Sampler after a graph replay."""
    model_dir = tiny_ckpt("llama")
    prompts = random_prompts(5, 49152, 3, 30, seed=5)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=20, ignore_eos=True)
    eager = run_staggered(_unpadded_eager_engine(model_dir, async_scheduling=False), prompts, params)
    engine = _cuda_engine(model_dir, enforce_eager=False)
    assert run_staggered(engine, prompts, params) == eager
    assert engine.runner.graphs.num_logits_replays > 0  # the LM head inside small buckets' graphs


@needs_gpu
def test_sampling_kernel_gives_the_reference_samplers_tokens(tiny_ckpt: Callable[[str], Path]) -> None:
    """kernels/random_sample.py in the CUDA engine against the sorting reference (kernels="torch"):
    seeded rows with each filter, all of them together, and a greedy row in one batch."""
    model_dir = tiny_ckpt("llama")
    prompts = random_prompts(4, 49152, 3, 30, seed=6)
    params = mixed_sampling_params(max_tokens=24)
    reference = run_staggered(_cuda_engine(model_dir, enforce_eager=True, kernels="torch"), prompts, params)
    assert run_staggered(_cuda_engine(model_dir, enforce_eager=False), prompts, params) == reference


@needs_gpu
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_large_mixed_buckets_give_the_eager_tokens(kind: str, tiny_ckpt: Callable[[str], Path]) -> None:
    """Steps of 640 to 8,192 tokens (long prompts together, and arriving while others decode) replay the large
    mixed buckets' graphs, padded with up to a quarter of their tokens, and give the unpadded eager engine's
    tokens and logprobs."""
    model_dir = tiny_ckpt(kind)
    prompts = random_prompts(12, 49152, 300, 1000, seed=21)
    arrivals = [0, 0, 0, 1, 1, 2, 4, 4, 4, 4, 6, 9]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    large = dict(max_num_batched_tokens=8192, num_kv_tokens=16384)
    reference = run_with_logprobs(
        _unpadded_eager_engine(model_dir, async_scheduling=False, **large), prompts, params, arrivals
    )
    engine = _cuda_engine(model_dir, enforce_eager=False, **large)
    graphs = engine.runner.graphs
    assert graphs.capture and graphs.mixed_sizes[-1] == 8192
    buckets: list[tuple[int, int]] = []
    run = graphs.run
    graphs.run = lambda bucket, greedy=False: (buckets.append(bucket), run(bucket, greedy))[1]
    assert_same_outputs(run_with_logprobs(engine, prompts, params, arrivals), reference, tol=1e-4)
    large_steps = sorted({t for t, s in buckets if t != s and t > 512})
    assert len(large_steps) >= 2, buckets  # several large buckets replayed, not only one
