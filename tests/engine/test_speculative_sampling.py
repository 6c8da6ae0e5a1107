"""Sampled requests under speculative decoding: the distribution of the tokens chosen at verified positions is
the distribution without speculation (a chi-square test of homogeneity over many seeds, on a support made
tiny by top_k), and each seed's tokens are the very ones it draws without speculation."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts
from tests.engine.spec_helpers import ReferenceProposer, spec_config, with_proposer

NUM_SEEDS = 90
MAX_TOKENS = 5  # t0 from the prefill, t1..t4 from verification steps of up to 3 proposals


def _run(engine, prompt: list[int], seeds: range) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for seed in seeds:
        params = SamplingParams(temperature=1.0, top_k=3, seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)
        engine.add_request(f"s{seed - seeds.start}", prompt, params)
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


def chi_square_p_value(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of homogeneity over the categories of a and b (those with fewer than 5
    expected counts pooled into one); the p-value by the Wilson-Hilferty normal approximation of the chi-square
    distribution (no scipy here)."""
    na, nb = sum(a.values()), sum(b.values())
    categories, rare = [], (0, 0)
    for key in set(a) | set(b):
        pair = (a[key], b[key])
        if min(sum(pair) * na / (na + nb), sum(pair) * nb / (na + nb)) < 5:
            rare = (rare[0] + pair[0], rare[1] + pair[1])
        else:
            categories.append(pair)
    if sum(rare):
        categories.append(rare)
    statistic = 0.0
    for x, y in categories:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            statistic += (observed - expected) ** 2 / expected
    df = len(categories) - 1
    if df < 1:
        return 1.0
    z = ((statistic / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_chi_square_helper_tells_different_distributions_apart() -> None:
    same = chi_square_p_value(Counter({1: 100, 2: 200, 3: 300}), Counter({1: 105, 2: 190, 3: 305}))
    different = chi_square_p_value(Counter({1: 100, 2: 200, 3: 300}), Counter({1: 200, 2: 200, 3: 200}))
    assert same > 0.3 and different < 1e-6


def test_sampled_tokens_at_verified_positions_keep_their_distribution(tiny_llama_dir: Path) -> None:
    prompt = random_prompts(1, 49152, 12, 12, seed=21)[0]
    size = dict(max_num_seqs=NUM_SEEDS, num_kv_tokens=NUM_SEEDS * 32)
    plain = _run(make_engine(tiny_llama_dir, **size), prompt, range(NUM_SEEDS))
    other_seeds = _run(make_engine(tiny_llama_dir, **size), prompt, range(NUM_SEEDS, 2 * NUM_SEEDS))
    # proposals: each seed's own continuation, wrong at one position in three (which one varies by seed)
    proposer = ReferenceProposer(plain, wrong=lambda rid, i: (int(rid[1:]) + i) % 3 == 0)
    config = spec_config(3, max_batch_size=NUM_SEEDS)
    engine = with_proposer(make_engine(tiny_llama_dir, **size, speculative=config), proposer)
    spec = _run(engine, prompt, range(NUM_SEEDS))
    stats = engine.speculator.stats
    assert stats.num_drafts >= NUM_SEEDS and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert spec == plain  # each seed: the same tokens
    for position in (1, 2, 3, 4):  # verified rows: t1 always, the later ones after accepted proposals or not
        with_spec = Counter(tokens[position] for tokens in spec.values())
        without = Counter(tokens[position] for tokens in other_seeds.values())
        assert len(with_spec) >= 3  # a real spread over the support, not one token
        assert chi_square_p_value(with_spec, without) > 1e-3, position
