"""The sort-free sampling kernel against the engine's sorting torch sampler (engine/torch_sampling.py).

The kernel and the reference draw the same noise (the (seed, position, token) hash) and keep the same
sets, so they pick the same token. The one licence of the precision contract: where the two disagree,
the reference's scores of both tokens must be within float rounding of each other (a near tie the
race in log space can break the other way). Logits are drawn coarse enough that exact ties among the
top tokens do not occur by chance.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.request import Request
from engine.sampler import Sampler, sampling_key
from engine.sampling_params import SamplingParams
from engine.torch_sampling import filter_top_k_top_p_min_p, mix32, random_sample_torch, uniform_from_keys
from kernels.greedy_sample import row_chunks
from kernels.random_sample import asks_step_0, pack_params, random_sample, wants_step_0
from kernels.top_k_select import top_k_thresholds

# (temperature, top_k, top_p, min_p): each filter alone, all together, greedy and plain temperature
CONFIGS = [
    (0.8, 0, 1.0, 0.0),
    (1.0, 40, 1.0, 0.0),
    (0.7, 0, 0.9, 0.0),
    (1.2, 0, 1.0, 0.1),
    (0.9, 20, 0.8, 0.05),
    (0.0, 0, 1.0, 0.0),
    (1.5, 1, 1.0, 0.0),
    (0.6, 0, 0.3, 0.0),
    (1.0, 7, 0.5, 0.0),
]


def _params(configs, seeds, positions, device) -> torch.Tensor:
    t, k, p, m = (list(col) for col in zip(*configs, strict=True))
    keys = [sampling_key(seed, pos) for seed, pos in zip(seeds, positions, strict=True)]
    return pack_params(t, k, p, m, keys).to(device)


def _reference(logits: torch.Tensor, configs, seeds, positions) -> tuple[list[int], torch.Tensor]:
    """(tokens, scores [S, V]) of engine.sampler's path: filters by sorting, then argmax p / E."""
    tokens, scores = [], []
    for row, ((temp, top_k, top_p, min_p), seed, pos) in enumerate(zip(configs, seeds, positions, strict=True)):
        x = logits[row : row + 1].double().float()
        if temp == 0:
            tokens.append(int(x.argmax()))
            scores.append(x[0])
            continue
        x = filter_top_k_top_p_min_p(x / temp, [top_k], [top_p], [min_p])
        probs = torch.softmax(x, dim=-1)
        noise = -torch.log(uniform_from_keys(torch.tensor([sampling_key(seed, pos)]), x.shape[-1]))
        score = (probs / noise)[0]
        tokens.append(int(score.argmax()))
        scores.append(score)
    return tokens, torch.stack(scores)


def _assert_same_or_near_tie(got: list[int], want: list[int], scores: torch.Tensor) -> None:
    for row, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            best, other = float(scores[row, w]), float(scores[row, g])
            assert math.isclose(best, other, rel_tol=1e-5), f"row {row}: {g} (score {other}), reference {w} ({best})"


# select_top_k: True runs step 0 (the chunked radix select) for the top-k rows; False leaves top-k to the
# check kernel and the single-program path (the engine's choice between them: wants_step_0)
STEP_0 = pytest.mark.parametrize("select_top_k", [True, False], ids=["step0", "no_step0"])


@STEP_0
@pytest.mark.parametrize("vocab", [1000, 4096 + 37])
def test_kernel_picks_the_reference_token(vocab, select_top_k, device):
    gen = torch.Generator().manual_seed(vocab)
    configs = CONFIGS * 3
    seeds = torch.randint(0, 2**40, (len(configs),), generator=gen).tolist()
    positions = torch.randint(0, 5000, (len(configs),), generator=gen).tolist()
    # a peaked, model-like distribution: a few likely tokens over a long tail, in steps of 1/64
    logits = (torch.randn(len(configs), vocab, generator=gen) * 2).mul(64).round().div(64)
    logits[:, :5] += 6
    params = _params(configs, seeds, positions, device)
    out = random_sample(logits.to(device), params, select_top_k=select_top_k).cpu()
    want, scores = _reference(logits, configs, seeds, positions)
    _assert_same_or_near_tie(out[0].tolist(), want, scores)
    assert out[1].tolist() == [1] * len(configs)


@STEP_0
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16_bit_logits_pick_the_tokens_of_their_widened_copy(dtype, select_top_k, device):
    """The engine hands the kernel the LM head's output in the model's dtype (engine/model_runner.py,
    _samples_in_a_kernel) where it used to widen it to float32 first: every load widens exactly, so
    each row must take the token, and the finiteness flag, of the float32 copy."""
    gen = torch.Generator().manual_seed(11)
    configs = CONFIGS * 2
    seeds = torch.randint(0, 2**40, (len(configs),), generator=gen).tolist()
    positions = torch.randint(0, 5000, (len(configs),), generator=gen).tolist()
    logits = (torch.randn(len(configs), 1000, generator=gen) * 3).to(dtype)
    logits[:, :4] += 5
    logits[-1, 17] = float("inf")  # a non-finite row: flagged, as in the copy
    params = _params(configs, seeds, positions, device)
    narrow = random_sample(logits.to(device), params, select_top_k=select_top_k).cpu()
    wide = random_sample(logits.float().to(device), params, select_top_k=select_top_k).cpu()
    assert torch.equal(narrow, wide)
    assert narrow[1].tolist() == [1] * (len(configs) - 1) + [0]


def test_nucleus_rounds_reach_tokens_far_below_the_first_winner(device):
    """top_p small over a flat distribution: most races' first winner lies outside the nucleus, so
    the kernel takes several rounds; every row must still match the reference."""
    gen = torch.Generator().manual_seed(7)
    vocab, rows = 512, 24
    configs = [(1.0, 0, 0.05, 0.0)] * rows
    seeds, positions = list(range(rows)), [3] * rows
    logits = torch.linspace(0, 2, vocab)[torch.randperm(vocab, generator=gen)].repeat(rows, 1)
    out = random_sample(logits.to(device), _params(configs, seeds, positions, device)).cpu()
    want, scores = _reference(logits, configs, seeds, positions)
    _assert_same_or_near_tie(out[0].tolist(), want, scores)
    assert len(set(want)) > 3  # the seeds spread over the nucleus, not one token


@STEP_0
def test_top_k_takes_the_kth_value_across_signs_and_magnitudes(select_top_k, device):
    """Radix select over floats of both signs: with top_k = k and a flat temperature-1 race, every
    chosen token must be among the k largest, and the k-th largest itself must be reachable."""
    vocab, k = 3000, 17
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(1, vocab, generator=gen) * 1e3).repeat(64, 1)  # no ties, wide range of exponents
    configs = [(1e6, k, 1.0, 0.0)] * 64  # a huge temperature: nearly uniform over the top-k set
    params = _params(configs, list(range(64)), [0] * 64, device)
    out = random_sample(logits.to(device), params, select_top_k=select_top_k).cpu()
    top = set(logits[0].topk(k).indices.tolist())
    assert set(out[0].tolist()) <= top
    assert len(set(out[0].tolist())) > k // 2


@STEP_0
@pytest.mark.parametrize("chunks", [1, 3])
def test_top_k_never_takes_the_next_token(chunks, select_top_k, device):
    """Four likely tokens and top_k = 3: the race's first winner is often the 4th, which must be refused
    (in the chunked check, and in the single-program path with top-p)."""
    logits = torch.full((48, 4500), -20.0)
    logits[:, [7, 300, 2901, 4499]] = torch.tensor([2.0, 1.9, 1.8, 1.7])
    configs = [(1.0, 3, 1.0, 0.0)] * 24 + [(1.0, 3, 0.999, 0.0)] * 24
    params = _params(configs, list(range(48)), [5] * 48, device)
    out = random_sample(logits.to(device), params, chunks=chunks, select_top_k=select_top_k).cpu()
    assert set(out[0].tolist()) == {7, 300, 2901}
    want, scores = _reference(logits, configs, list(range(48)), [5] * 48)
    _assert_same_or_near_tie(out[0].tolist(), want, scores)


def _key_whose_top_cell_is(token: int) -> int:
    """A key whose hash for `token` has its top 24 bits all set: u would round to 1.0 (1 token in 2**24)."""
    step = token * 0x9E3779B
    for start in range(0, 2**32, 2**22):
        keys = torch.arange(start, start + 2**22, dtype=torch.int64)
        hits = (mix32((keys + step) & 0xFFFFFFFF) >> 8 == 2**24 - 1).nonzero()
        if len(hits):
            return start + int(hits[0])
    raise AssertionError("no key found")


def test_the_top_noise_cell_is_a_draw_like_any_other(device):
    """The hash value whose uniform rounds to 1.0 in fp32: clamped below 1, its tiny noise makes that
    token win by a wide margin in the kernel and the reference alike (it had lost every race in the
    reference, p / -0.0, and won every race in log space, x - log 0)."""
    key, vocab = _key_whose_top_cell_is(3), 1000
    assert float(uniform_from_keys(torch.tensor([key]), vocab)[0, 3]) < 1.0
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(2))
    logits[1, 3] = logits[1].max() - 30  # far below the rest: even that noise cannot lift it
    params = pack_params([1.0, 1.0], [0, 0], [1.0, 1.0], [0.0, 0.0], [key, key])
    want = random_sample_torch(logits, params)[0].tolist()
    assert want[0] == 3 and want[1] != 3
    assert random_sample(logits.to(device), params.to(device))[0].tolist() == want


def test_non_finite_rows_are_flagged_and_other_rows_unaffected(device):
    logits = torch.randn(3, 700)
    logits[1, 5] = float("nan")
    logits[2, 9] = float("-inf")
    configs = [(0.8, 0, 0.9, 0.0)] * 3
    out = random_sample(logits.to(device), _params(configs, [1, 2, 3], [0, 0, 0], device)).cpu()
    assert out[1].tolist() == [1, 0, 0]
    assert out[0, 1:].tolist() == [0, 0]
    want, scores = _reference(logits[:1], configs[:1], [1], [0])
    _assert_same_or_near_tie(out[0, :1].tolist(), want, scores)


@STEP_0
def test_masked_logits_sample_only_allowed_tokens(select_top_k, device):
    """masked=True (a grammar's bitmask went over the logits, kernels/token_bitmask.py): the tokens of the
    reference over the same masked logits, each inside its row's allowed set, every filter config; -inf is
    no fault, while NaN and a row left with no token still are."""
    gen = torch.Generator().manual_seed(3)
    configs = CONFIGS * 2
    vocab = 4096 + 37
    seeds, positions = list(range(len(configs))), [9] * len(configs)
    logits = (torch.randn(len(configs), vocab, generator=gen) * 2).mul(64).round().div(64)
    logits[:, :5] += 6
    allowed = torch.rand(len(configs), vocab, generator=gen) < 0.2
    allowed[:, 0] = False  # a likely token forbidden
    logits = logits.masked_fill(~allowed, float("-inf"))
    params = _params(configs, seeds, positions, device)
    out = random_sample(logits.to(device), params, masked=True, select_top_k=select_top_k).cpu()
    assert out[1].tolist() == [1] * len(configs)
    assert all(allowed[row, token] for row, token in enumerate(out[0].tolist()))
    want, scores = _reference(logits, configs, seeds, positions)
    _assert_same_or_near_tie(out[0].tolist(), want, scores)
    assert random_sample_torch(logits, params.cpu(), masked=True)[0].tolist() == want
    assert random_sample(logits.to(device), params, select_top_k=select_top_k)[1].tolist() == [0] * len(configs)
    bad = logits[:3].clone()
    bad[1, 4] = float("nan")
    bad[2] = float("-inf")
    flags = random_sample(bad.to(device), params[:, :3].contiguous(), masked=True, select_top_k=select_top_k)[1]
    assert flags.tolist() == [1, 0, 0]
    assert random_sample_torch(bad, params[:, :3].cpu().contiguous(), masked=True)[1].tolist() == [1, 0, 0]


def test_same_seed_and_position_give_the_same_token_in_any_batch(device):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(1, 2000, generator=gen) * 3
    alone = random_sample(logits.to(device), _params([(0.9, 0, 0.95, 0.0)], [42], [10], device))[0, 0]
    batch = torch.cat([torch.randn(5, 2000, generator=gen), logits])
    configs = [(1.0, 5, 1.0, 0.0)] * 5 + [(0.9, 0, 0.95, 0.0)]
    together = random_sample(batch.to(device), _params(configs, [1, 2, 3, 4, 5, 42], [0] * 5 + [10], device))
    assert int(together[0, 5]) == int(alone)


def test_launcher_names_what_it_rejects(device):
    logits = torch.randn(2, 100, device=device)
    with pytest.raises(ValueError, match="params must be a contiguous \\[5, 2\\] float64"):
        random_sample(logits, torch.zeros(5, 3, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        random_sample(logits.t(), torch.zeros(5, 100, dtype=torch.float64, device=device))


def test_references_agree_with_the_engine_sampler():
    """The test's scoring reference and random_sample_torch give the tokens of the engine's Sampler on
    real requests (its path for penalties and logprobs, and on the CPU)."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(len(CONFIGS), 300, generator=gen) * 2
    seeds, positions = list(range(len(CONFIGS))), [3] * len(CONFIGS)
    requests = [
        Request("r", [1, 2, 3], SamplingParams(temperature=t, top_k=k or -1, top_p=p, min_p=m), frozenset({0}), seed=s)
        for (t, k, p, m), s in zip(CONFIGS, seeds, strict=True)
    ]
    tokens, _, _ = Sampler().sample(logits, requests)
    assert tokens.tolist() == _reference(logits, CONFIGS, seeds, positions)[0]
    params = _params(CONFIGS, seeds, positions, torch.device("cpu"))
    assert random_sample_torch(logits, params)[0].tolist() == tokens.tolist()


@pytest.mark.parametrize("chunks", [1, 3])
def test_step_0_finds_the_kth_largest_value(chunks, device):
    """The chunked radix select against torch.topk: both signs, wide magnitudes, ties at the k-th value,
    k = 1 and k = V - 1, a temperature's scaling; rows without top-k (or greedy) are not taken."""
    vocab = 4500
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(8, vocab, generator=gen) * torch.logspace(-3, 3, 8)[:, None]
    logits[3] = (logits[3] * 4).round() / 4  # many ties, the k-th value among them
    logits[4, :100] = 7.5  # 100 tokens tied at the top, k inside the run
    configs = [(1.0, 1, 1.0, 0.0), (0.7, 17, 1.0, 0.0), (1.3, 64, 0.9, 0.0), (1.0, 500, 1.0, 0.0),
               (1.0, 40, 1.0, 0.0), (2.0, vocab - 1, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (0.0, 5, 1.0, 0.0)]  # fmt: skip
    params = _params(configs, list(range(8)), [0] * 8, device)
    got = top_k_thresholds(logits.to(device), params, chunks=chunks).cpu()
    for row, (temperature, k, _, _) in enumerate(configs):
        if temperature == 0 or k == 0:
            assert math.isnan(got[row])
            continue
        x = logits[row] * (1.0 / torch.tensor(temperature, dtype=torch.float32))
        torch.testing.assert_close(got[row], x.topk(k).values[-1], rtol=1e-6, atol=0)


def test_step_0_runs_for_top_k_with_top_p_over_several_programs_a_row(device):
    """The engine's rule (asks_step_0 per row, wants_step_0 per batch): step 0 only where the single-program
    path would otherwise run for every such row, and only when a row has more than one program."""
    assert asks_step_0(0.7, 20, 0.8)
    assert not asks_step_0(0.7, 50, 1.0)  # top-k alone: the check refuses rarely on peaked rows
    assert not asks_step_0(0.0, 20, 0.8)  # greedy
    assert not asks_step_0(0.7, 0, 0.8)  # top-p alone
    assert wants_step_0(True, 1, 4096 + 37, device) == (row_chunks(1, 4096 + 37, device, None) > 1)
    assert not wants_step_0(True, 1, 1000, device)  # one tile: one program a row
    assert not wants_step_0(False, 1, 128256, device)
