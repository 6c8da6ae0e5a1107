"""The service benchmark's workloads and per-run figures (bench/service_overhead.py): the offline
throughput workload at its seeds, the sequential TTFT requests, and the median of repeated runs.
"""

from __future__ import annotations

import time

from bench.offline_throughput import MAX_LEN, MIN_LEN, NUM_SEQS, workload

TTFT_REQUESTS, TTFT_PROMPT, TTFT_NEW_TOKENS = 20, 128, 16


def shape(dry_run: bool, num_seqs: int | None = None) -> tuple[int, int, int, int, int, int]:
    """(sequences, min length, max length, TTFT requests, TTFT prompt, TTFT new tokens)."""
    if dry_run:
        return num_seqs or 8, 10, 40, 5, 32, 4
    return num_seqs or NUM_SEQS, MIN_LEN, MAX_LEN, TTFT_REQUESTS, TTFT_PROMPT, TTFT_NEW_TOKENS


def workloads(vocab_size: int, dry_run: bool, num_seqs: int | None = None) -> tuple[list, list, list, list]:
    num, lo, hi, ttft_n, ttft_len, _ = shape(dry_run, num_seqs)
    prompts, prompt_lens, output_lens = workload(vocab_size, num, lo, hi, seed=0)
    ttft_prompts, _, _ = workload(vocab_size, ttft_n, ttft_len, ttft_len, seed=2)
    return prompts, prompt_lens, output_lens, ttft_prompts


def repeat_seeds(repeats: int) -> list[int]:
    """The throughput workload's seeds: 0 first (the one BENCHMARKS.md names), then others that
    avoid the warm-up's and the TTFT prompts' seeds (1 to 3)."""
    return [0] + [100 + i for i in range(1, repeats)]


def more_workloads(
    vocab_size: int, dry_run: bool, num_seqs: int | None, repeats: int
) -> list[tuple[int, list, list, list]]:
    """(seed, prompts, prompt lengths, output lengths) of the repeats after seed 0's run."""
    num, lo, hi = shape(dry_run, num_seqs)[:3]
    return [(seed, *workload(vocab_size, num, lo, hi, seed=seed)) for seed in repeat_seeds(repeats)[1:]]


def run_figures(seed: int, elapsed: float, prompt_lens: list[int], output_lens: list[int]) -> dict:
    return {
        "seed": seed,
        "elapsed_s": elapsed,
        "output_tok_s": sum(output_lens) / elapsed,
        "total_tok_s": (sum(output_lens) + sum(prompt_lens)) / elapsed,
    }


def median_run(runs: list[dict]) -> dict:
    """The run with the median output throughput (the lower one of the middle two for an even count)."""
    ranked = sorted(runs, key=lambda run: run["output_tok_s"])
    return ranked[(len(ranked) - 1) // 2]


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def engine_ttfts(engine, prompts: list[list[int]], new_tokens: int, prefix: str = "ttft") -> list[float]:
    """The engine's own TTFT of each prompt, one at a time (ms): add_request to the step that returns its first
    token, greedy, ignore_eos."""
    from engine.sampling_params import SamplingParams

    ttfts = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        start, first = time.perf_counter(), None
        engine.add_request(f"{prefix}{i}", prompt, params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.new_token_ids:
                    first = time.perf_counter()
        ttfts.append((first - start) * 1000)
    return ttfts
