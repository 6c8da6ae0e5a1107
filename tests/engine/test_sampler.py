"""Sampler: greedy, seeded randomness as a function of (seed, position), filters, penalties, bias, logprobs."""

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.request import Request
from engine.sampler import Sampler, sampling_key, sampling_keys, seeded_uniform
from engine.sampling_params import MAX_SEED, SamplingParams
from engine.torch_sampling import filter_top_k_top_p_min_p, uniform_from_keys

V = 50


def req(tokens=(1, 2, 3), seed=0, eos=frozenset({0}), **params) -> Request:
    return Request("r", list(tokens), SamplingParams(**params), eos_token_ids=eos, seed=seed)


def test_greedy_takes_argmax():
    logits = torch.randn(3, V)
    out = Sampler()(logits, [req(temperature=0.0) for _ in range(3)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_seeded_uniform_is_a_pure_function_and_in_range():
    seeds = torch.tensor([1, 2**62 + 5, 1])
    pos = torch.tensor([10, 10, 11])
    u1 = seeded_uniform(seeds, pos, 1000)
    u2 = seeded_uniform(seeds.flip(0).flip(0), pos.clone(), 1000)
    assert torch.equal(u1, u2)
    assert (u1 > 0).all() and (u1 < 1).all()
    assert not torch.equal(u1[0], u1[2]) and not torch.equal(u1[0], u1[1])
    big = seeded_uniform(torch.arange(200), torch.zeros(200, dtype=torch.int64), 1000)
    assert abs(big.mean().item() - 0.5) < 0.01 and abs(big.var().item() - 1 / 12) < 0.005


def test_host_keys_give_the_same_draws_as_the_tensor_hash():
    """The sampler hashes (seed, position) on the host (sampling_key): bit for bit the draws of
    seeded_uniform's tensor hash, so a seeded request makes the choices it made before."""
    gen = torch.Generator().manual_seed(0)
    seeds = [0, 1, 2**32 - 1, 2**32, MAX_SEED, *torch.randint(0, MAX_SEED, (27,), generator=gen).tolist()]
    positions = [0, 7, 2**31, 2**40 + 3, *torch.randint(0, 2**20, (28,), generator=gen).tolist()]
    keys = torch.tensor([sampling_key(seed, pos) for seed, pos in zip(seeds, positions, strict=True)])
    want = seeded_uniform(torch.tensor(seeds), torch.tensor(positions), 5003)
    assert torch.equal(uniform_from_keys(keys, 5003), want)
    # the engine's batch form (requests sample at num_tokens_with_pending) gives the same keys
    requests = []
    for seed, pos in zip(seeds, positions, strict=True):
        if pos > 2**20:
            continue  # a prompt that long is not worth building; the single form covers those positions
        request = req(seed=seed)
        request.all_token_ids = [1] * pos
        requests.append(request)
    assert len(requests) > 20
    assert sampling_keys(requests) == [sampling_key(r.seed, r.num_tokens_with_pending) for r in requests]
    assert [sampling_key(r.seed, r.num_tokens_with_pending) for r in requests] == keys[
        [i for i, pos in enumerate(positions) if pos <= 2**20]
    ].tolist()


def _tensor_ops_of_one_sampled_step(**params) -> int:
    """Top-level torch operations of Sampler.sample at one row and a 128k vocabulary: on a GPU each
    that computes is a kernel launch, and the sampled batch-1 decode step is host-bound."""
    from torch.profiler import ProfilerActivity, profile

    sampler, request = Sampler(), req(seed=0, **params)
    logits = torch.randn(1, 128256)
    sampler.sample(logits, [request])  # warm (the cached token-id steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sampler.sample(logits, [request])
    ops = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(1 for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


def test_a_sampled_step_stays_a_few_dozen_tensor_operations():
    """122 operations before the (seed, position) hash moved to the host and unused filters were left
    out (README, "Sampling is a function of (seed, position)"); 57 and 39 after."""
    assert _tensor_ops_of_one_sampled_step(temperature=0.8, top_p=0.95) <= 60
    assert _tensor_ops_of_one_sampled_step(temperature=0.8) <= 42


def test_same_seed_and_position_give_same_token_in_any_batch():
    logits = torch.randn(1, V)
    a = Sampler()(logits, [req(seed=42, temperature=1.0)]).token_ids[0]
    batch = torch.cat([torch.randn(2, V), logits])
    b = Sampler()(batch, [req(seed=7), req(seed=8), req(seed=42, temperature=1.0)]).token_ids[2]
    assert a == b


def test_random_choice_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].repeat(4000, 1)
    requests = [req(tokens=[1] * (i + 1), seed=123) for i in range(4000)]  # 4000 positions
    tokens = torch.tensor(Sampler()(logits, requests).token_ids)
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq


@pytest.mark.parametrize("top_k,top_p,min_p", [(5, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.2), (7, 0.6, 0.05)])
def test_filters_match_transformers_warpers(top_k, top_p, min_p):
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 3
    ours = filter_top_k_top_p_min_p(logits.clone(), [top_k] * 4, [top_p] * 4, [min_p] * 4)
    ref = logits.clone()
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    if min_p:
        ref = MinPLogitsWarper(min_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    kept = ~torch.isinf(ref)
    assert torch.allclose(ours[kept], ref[kept])


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(1)
    logits = torch.randn(1, V)
    r = req(tokens=[3, 4, 4, 9], temperature=0.0, repetition_penalty=1.3)
    processed = Sampler()._apply_penalties(logits.clone(), [r])
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([[3, 4, 4, 9]]), logits.clone())
    assert torch.allclose(processed, ref)


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros(1, V)
    r = req(tokens=[5, 6], presence_penalty=0.5, frequency_penalty=0.25)
    r.append_token(6)
    r.append_token(6)
    r.append_token(7)
    out = Sampler()._apply_penalties(logits.clone(), [r])
    assert out[0, 5] == 0  # prompt only: untouched
    assert out[0, 6] == pytest.approx(-(0.5 + 2 * 0.25))
    assert out[0, 7] == pytest.approx(-(0.5 + 0.25))


def test_logit_bias_forces_a_token_and_min_tokens_blocks_eos():
    logits = torch.zeros(1, V)
    logits[0, 0] = 50.0  # EOS dominates
    out = Sampler()(logits, [req(temperature=0.0, logit_bias={17: 100.0})])
    assert out.token_ids == [17]
    out = Sampler()(logits, [req(temperature=0.0, min_tokens=2, max_tokens=5)])
    assert out.token_ids != [0]


def test_non_finite_row_is_an_error_for_that_row_only():
    logits = torch.randn(2, V)
    logits[1, 3] = float("nan")
    out = Sampler()(logits, [req(temperature=0.0), req(temperature=0.0)])
    assert out.errors[0] is None and "non-finite" in out.errors[1]
    assert out.token_ids[0] == logits[0].argmax().item()


def test_logprobs_are_raw_log_softmax_with_top_alternatives():
    torch.manual_seed(2)
    logits = torch.randn(1, V)
    out = Sampler()(logits, [req(temperature=0.0, logprobs=3)])
    lp = out.logprobs[0]
    ref = torch.log_softmax(logits[0], -1)
    assert lp.token_id == out.token_ids[0]
    assert math.isclose(lp.logprob, ref.max().item(), rel_tol=1e-6)
    assert list(lp.top) == ref.topk(3).indices.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device syncs exist only on CUDA")
def test_sampling_without_logprobs_never_waits_for_the_device():
    """The runner reads these tokens a step later (async scheduling): `sample` must queue work
    only. PyTorch's sync debug mode raises on any operation that waits for the device (such as a
    copy of a Python list from pageable memory, which synchronizes the stream)."""
    requests = [
        req([5, 6, 7], temperature=0.8, top_p=0.9),
        req([5, 6], seed=3, temperature=1.0, top_k=7, min_p=0.05),
        req([9], temperature=0.0, min_tokens=4, logit_bias={11: 2.0}),
        req([1, 2, 3, 4], seed=8, temperature=0.7),
    ]
    logits = torch.randn(len(requests), 1000, device="cuda")
    expected = Sampler()(logits, requests).token_ids  # the host path, which may wait
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        token_ids, bad, raw = Sampler().sample(logits, requests)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert raw is None and token_ids.tolist() == expected and not bad.any()


def test_warm_up_runs_each_sampling_variant_and_returns_its_tokens():
    """Sampler.warm_up (the engine's start on CUDA) runs the packed sampling path without and with top-k's step:
    two [2, R] outputs of in-vocabulary tokens from finite rows (on CPU, the kernels' reference)."""
    logits = torch.randn(3, 500)
    outputs = Sampler().warm_up(logits)
    assert len(outputs) == 2
    for packed in outputs:
        assert packed.shape == (2, 3) and packed.dtype == torch.int64
        assert ((packed[0] >= 0) & (packed[0] < 500)).all() and (packed[1] == 1).all()
