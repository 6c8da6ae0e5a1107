"""Speculative decoding is lossless: with proposals verified in one target forward, every request emits the
tokens it emits without speculation, greedy or seeded, for every model family, in continuous batches with
preemption and prefix caching; stop rules, limits, logprobs and penalties hold on the kept tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.proposers import NgramProposer
from engine.sampling_params import SamplingParams
from tests.engine.checkpoints import ARCHITECTURES
from tests.engine.engine_helpers import make_engine, random_prompts, run_staggered
from tests.engine.spec_helpers import ReferenceProposer, spec_config, with_proposer

ARRIVALS = [0, 0, 1, 2, 4, 6]


def _prompts(seed: int = 0) -> list[list[int]]:
    """Six prompts, four of them opening with one 32-token prefix (two 16-token blocks the prefix cache shares)."""
    prompts = random_prompts(6, 49152, 6, 26, seed=seed)
    shared = random_prompts(1, 49152, 32, 32, seed=seed + 100)[0]
    return [shared + p if i % 3 else p for i, p in enumerate(prompts)]


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_greedy_tokens_equal_without_speculation_with_preemption_and_prefix_caching(kind, tiny_checkpoint) -> None:
    model_dir = tiny_checkpoint(kind)
    prompts = _prompts()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tight = dict(num_kv_tokens=144, max_num_batched_tokens=96)  # 9 blocks of 16: requests get preempted
    plain_engine = make_engine(model_dir, **tight)
    plain = run_staggered(plain_engine, prompts, params, ARRIVALS)
    spec_engine = with_proposer(make_engine(model_dir, **tight, speculative=spec_config()), ReferenceProposer(plain))
    spec = run_staggered(spec_engine, prompts, params, ARRIVALS)
    assert spec == plain
    stats = spec_engine.speculator.stats
    assert spec_engine.scheduler.num_preemptions > 0
    assert spec_engine.block_manager.num_prefix_hits > 0
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # some proposals kept, some rejected
    assert spec_engine.stats().num_steps < plain_engine.stats().num_steps


def test_async_steps_around_speculating_steps_keep_greedy_tokens(tiny_llama_dir: Path) -> None:
    """With async scheduling, the steps the policy keeps from speculating (more running requests than
    max_batch_size) overlap as usual, and a speculating step first reads the step in flight."""
    prompts = _prompts(seed=3)[:5]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    arrivals = [0, 0, 0, 9, 12]
    plain = run_staggered(make_engine(tiny_llama_dir), prompts, params, arrivals)
    engine = make_engine(tiny_llama_dir, async_scheduling=True, speculative=spec_config(3, max_batch_size=2))
    with_proposer(engine, ReferenceProposer(plain))
    assert run_staggered(engine, prompts, params, arrivals) == plain
    assert engine.speculator.stats.num_drafts > 0
    assert engine.runner.inputs.num_pending_staged > 0  # steps that did not speculate overlapped


def test_ngram_proposer_matches_the_latest_longest_suffix() -> None:
    from engine.request import Request

    def request(tokens):
        return Request("x", tokens, SamplingParams())

    proposer = NgramProposer(ngram_max=3, ngram_min=1)
    # suffix [7, 8] (3-gram [5, 7, 8] never seen before): the latest earlier [7, 8] is followed by 4, 5
    assert proposer.propose([request([7, 8, 9, 7, 8, 4, 5, 7, 8])], [2]) == [[4, 5]]
    assert proposer.propose([request([1, 2, 3, 4])], [3]) == [[]]  # nothing repeats
    assert proposer.propose([request([1, 2, 3, 1, 2, 3])], [5]) == [[1, 2, 3]]  # runs to the end of the tokens
    assert proposer.propose([request([5, 5])], [0]) == [[]]


def test_seeded_sampling_is_the_same_token_for_token(tiny_llama_dir: Path) -> None:
    """Sampled rows draw the same (seed, position) noise at each verified position: the same tokens, with
    penalties, bias, min_tokens and logprobs on the kept tokens."""
    prompts = _prompts(seed=5)[:4]
    common = dict(max_tokens=20, ignore_eos=True)
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=11, logprobs=2, **common),
        SamplingParams(temperature=1.2, top_k=40, min_p=0.02, seed=12, repetition_penalty=1.3, **common),
        SamplingParams(temperature=0.8, seed=13, presence_penalty=0.5, frequency_penalty=0.4, logit_bias={500: 3.0},
                       **common),
        SamplingParams(temperature=1.0, seed=14, min_tokens=10, **dict(common, ignore_eos=False)),
    ]  # fmt: skip

    def run(engine):
        outs: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
        logprobs: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(f"r{i}", prompt, p)
        while engine.has_unfinished_requests():
            for out in engine.step():
                outs[out.request_id] += out.new_token_ids
                logprobs[out.request_id] += [(lp.token_id, round(lp.logprob, 4)) for lp in out.new_logprobs or []]
        return outs, logprobs

    plain, plain_logprobs = run(make_engine(tiny_llama_dir))
    engine = with_proposer(make_engine(tiny_llama_dir, speculative=spec_config(4)), ReferenceProposer(plain))
    spec, spec_logprobs = run(engine)
    assert spec == plain
    assert spec_logprobs == plain_logprobs and len(spec_logprobs["r0"]) == 20
    assert 0 < engine.speculator.stats.num_accepted_tokens < engine.speculator.stats.num_draft_tokens


def test_stop_strings_and_max_tokens_cut_the_kept_tokens(tiny_llama_dir: Path) -> None:
    """A stop string or max_tokens met inside an accepted run ends the request there: the tokens after it are
    not emitted, and the finish reason and text are those of the run without speculation."""
    prompt = _prompts(seed=9)[0]
    free = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    plain_engine = make_engine(tiny_llama_dir)
    reference = run_staggered(plain_engine, [prompt], free)["r0"]
    stop_text = plain_engine.tokenizer.decode(reference[9:11])

    def final(engine, params):
        engine.add_request("r0", prompt, params)
        tokens, text, reason = [], "", None
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens += out.new_token_ids
                text += out.new_text
                reason = out.finish_reason or reason
        return tokens, text, reason

    for params in (SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
                   SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop_text])):  # fmt: skip
        expected = final(make_engine(tiny_llama_dir), params)
        proposer = ReferenceProposer({"r0": reference}, wrong=lambda rid, i: False)  # every proposal right
        engine = with_proposer(make_engine(tiny_llama_dir, speculative=spec_config(4)), proposer)
        assert final(engine, params) == expected
        assert engine.speculator.stats.num_accepted_tokens > 0


def test_verified_blocks_enter_the_prefix_cache_with_their_true_tokens(tiny_llama_dir: Path) -> None:
    """After verification steps (rejected proposals' KV written past the kept tokens), a request whose prompt
    is the first one's prompt and output hits the blocks the first one filled, and continues as without
    speculation."""
    prompt = _prompts(seed=4)[1]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    reference = run_staggered(make_engine(tiny_llama_dir), [prompt], params)["r0"]
    engine = with_proposer(
        make_engine(tiny_llama_dir, speculative=spec_config(4)), ReferenceProposer({"r0": reference})
    )
    assert run_staggered(engine, [prompt], params)["r0"] == reference
    hits = engine.block_manager.num_prefix_hits
    engine.speculator.proposer = NgramProposer()
    engine.add_request(
        "again", prompt + reference[:50], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    )
    rest = []
    while engine.has_unfinished_requests():
        rest += [t for out in engine.step() for t in out.new_token_ids]
    assert rest == reference[50:60]
    assert engine.block_manager.num_prefix_hits - hits >= (len(prompt) + 48) // 16 * 16


def test_the_policy_and_the_opt_out(tiny_llama_dir: Path) -> None:
    prompts = _prompts(seed=2)[:3]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = run_staggered(make_engine(tiny_llama_dir), prompts, params)
    # more running requests than max_batch_size: no step speculates
    engine = with_proposer(
        make_engine(tiny_llama_dir, speculative=spec_config(max_batch_size=2)), ReferenceProposer(plain)
    )
    assert run_staggered(engine, prompts, params) == plain and engine.speculator.stats.num_drafts == 0
    # every proposal wrong: the acceptance rate falls below the floor, then only every probe_interval-th step
    # speculates
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain_long = run_staggered(make_engine(tiny_llama_dir), prompts[:1], long)
    config = spec_config(min_acceptance_rate=0.5, probe_interval=4)
    wrong = ReferenceProposer(plain_long, lambda r, i: True)
    engine = with_proposer(make_engine(tiny_llama_dir, speculative=config), wrong)
    assert run_staggered(engine, prompts[:1], long) == plain_long
    # 39 decode steps: 2 until the recent rate (from 1, weight 0.5: 0.5, then 0.25) is below 0.5, then one in 4
    # (the last steps, with room for one token, propose nothing)
    assert 2 + (39 - 2) // 4 - 2 <= engine.speculator.stats.num_steps <= 2 + (39 - 2) // 4
    assert engine.speculator.recent_acceptance_rate < 0.5
    # a request that opts out never speculates; the others do
    engine = with_proposer(make_engine(tiny_llama_dir, speculative=spec_config()), ReferenceProposer(plain))
    opted = [params, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, speculative=False), params]
    seen = []
    engine.speculator.proposer = _Recording(engine.speculator.proposer, seen)
    assert run_staggered(engine, prompts, opted) == plain
    assert "r1" not in seen and "r0" in seen


class _Recording:
    def __init__(self, inner, seen: list[str]) -> None:
        self.inner, self.seen = inner, seen

    def propose(self, requests, budgets):
        self.seen += [r.request_id for r in requests]
        return self.inner.propose(requests, budgets)


COPY_TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump. The five boxing wizards jump quickly."
)


def test_ngram_proposer_on_the_packaged_smollm2_copying_text(smollm2_dir: Path) -> None:
    """The prompt-lookup proposer on a real model asked to repeat a text: the same greedy tokens, most of them
    from accepted proposals."""
    params = SamplingParams(temperature=0.0, max_tokens=40)
    plain_engine = make_engine(smollm2_dir)
    prompt = plain_engine.apply_chat_template([{"role": "user", "content": f"Repeat exactly: {COPY_TEXT}"}])
    plain = run_staggered(plain_engine, [prompt], params)
    engine = make_engine(smollm2_dir, speculative=spec_config(4))
    assert run_staggered(engine, [prompt], params) == plain
    stats = engine.speculator.stats
    assert stats.mean_accepted_length > 2.0, stats
    assert engine.stats().num_steps < plain_engine.stats().num_steps / 2


def test_steps_that_propose_nothing_turn_speculation_off() -> None:
    """Text that never repeats: every speculating step (synchronous) finds nothing to verify, the recent rate
    falls as if nothing were accepted, and only probe steps speculate after that."""
    from engine.request import Request, RequestStatus
    from engine.speculator import Speculator

    request = Request("x", [1, 2, 3, 4, 5], SamplingParams(max_tokens=50), max_num_tokens=55)
    request.status, request.num_computed_tokens = RequestStatus.RUNNING, 4
    speculator = Speculator(spec_config(min_acceptance_rate=0.5, probe_interval=4), NgramProposer())
    wants = []
    for _ in range(20):
        wants.append(speculator.wants_step(1))
        if wants[-1]:
            assert speculator.propose([request]) == []
    # the rate weighs each step by 0.5: 0.5, then 0.25 < 0.5 after two steps, then one in four
    assert wants == [True] * 2 + [False, False, False, True] * 4 + [False, False]


def test_a_step_where_no_request_can_speculate_leaves_the_rate() -> None:
    """A request at its last token cannot take a proposal: such a step says nothing of the proposer, so the recent
    rate (which a step of no accepted tokens would halve) stays, and the next request still speculates."""
    from engine.request import Request, RequestStatus
    from engine.speculator import Speculator

    request = Request("x", [1, 2, 3, 1, 2], SamplingParams(max_tokens=1), max_num_tokens=6)
    request.status, request.num_computed_tokens = RequestStatus.RUNNING, 4
    speculator = Speculator(spec_config(), NgramProposer())
    for _ in range(3):
        assert speculator.wants_step(1) and speculator.propose([request]) == []
    assert speculator.recent_acceptance_rate == 1.0


def test_draft_model_itself_and_a_perturbed_copy(tiny_llama_dir: Path, smollm2_dir: Path, tmp_path: Path) -> None:
    """The draft-model proposer: the model as its own draft keeps every proposal (greedy and seeded rows alike:
    the draft samples with the same noise of seed and position); a copy with other weights keeps few. Either
    way the tokens are those without speculation, with the draft's own KV pool too small for every request (a
    request that finds no room there gets no proposal in that step)."""
    from tests.engine.checkpoints import build_tiny_checkpoint

    other = build_tiny_checkpoint("llama", tmp_path / "other", smollm2_dir, seed=1)
    prompts = _prompts(seed=6)[:5]
    common = dict(max_tokens=24, ignore_eos=True)
    params = [SamplingParams(temperature=0.0, **common) if i % 2 else
              SamplingParams(temperature=0.8, top_p=0.9, seed=i, **common) for i in range(len(prompts))]  # fmt: skip
    plain = run_staggered(make_engine(tiny_llama_dir), prompts, params, [0, 0, 1, 2, 3])
    for draft, kept in ((tiny_llama_dir, 1.0), (other, 0.2)):
        config = spec_config(4, method="draft", draft_model=str(draft), draft_num_kv_tokens=160)
        engine = make_engine(tiny_llama_dir, speculative=config)
        # the model's decode rows store k + 1 keys a step before reading them; the draft only decodes
        assert (engine.runner.inputs.num_fresh_keys, engine.speculator.proposer.runner.inputs.num_fresh_keys) == (5, 1)
        assert run_staggered(engine, prompts, params, [0, 0, 1, 2, 3]) == plain
        stats = engine.speculator.stats
        rate = stats.num_accepted_tokens / stats.num_draft_tokens
        assert (rate == 1.0) if kept == 1.0 else (rate < kept), (draft, stats)


def test_packaged_smollm2_with_itself_and_a_perturbed_copy_as_drafts(smollm2_dir: Path, tmp_path: Path) -> None:
    """The packaged SmolLM2 (real weights) drafted by itself keeps nearly every proposal; drafted by a copy whose
    weights carry noise it keeps some and rejects others. Its tokens are those without speculation either way."""
    params = SamplingParams(temperature=0.0, max_tokens=24)
    plain_engine = make_engine(smollm2_dir)
    prompt = plain_engine.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}])
    plain = run_staggered(plain_engine, [prompt], params)
    perturbed = _perturbed_copy(smollm2_dir, tmp_path / "perturbed", scale=0.05)
    for draft in (smollm2_dir, perturbed):
        engine = make_engine(smollm2_dir, speculative=spec_config(4, method="draft", draft_model=str(draft)))
        assert run_staggered(engine, [prompt], params) == plain
        stats = engine.speculator.stats
        if draft == smollm2_dir:
            assert stats.mean_accepted_length > 3.5
        else:
            assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats


def _perturbed_copy(model_dir: Path, out: Path, scale: float) -> Path:
    """A copy of a checkpoint directory whose floating weights carry Gaussian noise of `scale` times each tensor's
    standard deviation (seeded)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    generator = torch.Generator().manual_seed(0)
    for path in out.glob("*.safetensors"):
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if tensor.is_floating_point() and tensor.numel() > 1:
                noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std() * scale
                tensors[name] = (tensor.float() + noise).to(tensor.dtype)
        save_file(tensors, path, metadata={"format": "pt"})
    return out


def test_verification_steps_run_as_decode_rows_or_through_the_mixed_graph_buckets(tiny_llama_dir: Path) -> None:
    """A verification step of decodes runs as decode rows (engine/verify_rows.py: k + 1 one-token rows a verifying
    sequence) padded to a decode bucket, while its rows fit the step's sequences (max_num_seqs); a larger one is a
    mixed step padded to a mixed bucket, its k + 1 rows a sequence sampled from the bucket's hidden states. Both
    over the static buffers their CUDA graphs read (run eagerly here: StepGraphs with capture=False), in one run,
    with the tokens of a run without speculation."""
    from engine.step_timer import StepTimer

    prompts = _prompts(seed=8)[:4]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    arrivals = [0, 0, 3, 3]  # two sequences alone for a while (8 rows: decode rows), then four (16 rows: mixed)
    plain = run_staggered(make_engine(tiny_llama_dir), prompts, params, arrivals)
    engine = make_engine(tiny_llama_dir, max_num_seqs=8, max_num_batched_tokens=64, speculative=spec_config(3))
    engine.runner.enable_graphs(capture=False)
    engine.runner.timer = StepTimer(engine.device)
    with_proposer(engine, ReferenceProposer(plain))
    assert run_staggered(engine, prompts, params, arrivals) == plain
    verifying = [r for r in engine.runner.timer.records if r.graphed and r.num_tokens > r.num_seqs]
    assert engine.speculator.stats.num_steps > 0
    as_rows, mixed = engine.runner.num_verified_as_rows, engine.runner.graphs.num_mixed_replays
    assert as_rows > 0 and mixed > 0
    assert as_rows + mixed == len(verifying) >= engine.speculator.stats.num_steps
    # 2 sequences verifying 3 proposals each: 8 decode rows; 4 of them: 16 tokens, 16 sampling rows in a (16, 8) bucket
    assert any(r.num_tokens == 8 and r.num_seqs == 2 for r in verifying)
    assert any(r.num_tokens == 16 and r.num_seqs == 4 for r in verifying)
