"""Quantized checkpoints on a CUDA GPU (GPU only; skipped elsewhere): the engine with the Triton quantized
GEMMs and CUDA graphs against the same engine on the torch references, same GPU, fp32 activations.

Weight-only formats (W4A16, W8A16): the same greedy tokens. fp8 (W8A8) quantizes each layer's activations
again, so an accumulation other than the reference's (the fp8 tensor-core dot keeps about 14 bits of its partial
sums on Hopper, the GEMV sums in another order) moves activation codes by whole fp8 steps, and on a tiny random
model that moves logprobs by tenths of a nat and flips greedy tokens at near ties (decision 0070). fp8 is held
instead to the reference's own sensitivity, measured in the test: the torch reference run again with every
activation it quantizes moved by a relative ACCUMULATION_NOISE (a deterministic pattern, graph-safe) gives the
noise floor; the Triton engine's logprobs must stay within NOISE_MULTIPLE times that floor (at least
LOGPROB_FLOOR) of the reference's, every prompt token's (teacher-forced: the prefill tiles) and each generated
token's up to its request's first flip, which must come at a near tie of the reference and not much earlier
than the noise run's flips.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tokenizer_dir
from tests.engine.quant_checkpoints import FORMATS, build_quantized_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ARRIVALS = [0, 0, 1, 2, 3, 5]
W8A8 = ("fp8_block", "ct_fp8_channel", "ct_fp8_tensor_static")
ACCUMULATION_NOISE = 2.0**-13  # relative, on each quantized activation: an fp8 tensor-core sum's last kept bits
NOISE_MULTIPLE = 2.0
LOGPROB_FLOOR = 0.05  # nats: the least tolerance, where the noise run happens to move nothing
TOP_LOGPROBS = 5  # a flip at a tie of several tokens takes one of the reference's top few


def _engine(model_dir: Path, kernels: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(num_kv_tokens=4096),
            scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=96),
            device="cuda",
            kernels=kernels,
        )
    )


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in W8A8])
def test_triton_quantized_engine_matches_the_torch_references(fmt: str, request, tmp_path: Path) -> None:
    build_quantized_checkpoint(fmt, tmp_path / fmt, tokenizer_dir(request))
    prompts = random_prompts(6, 49152, 3, 70, seed=FORMATS.index(fmt))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = run_staggered(_engine(tmp_path / fmt, "torch"), prompts, params, ARRIVALS)
    engine = _engine(tmp_path / fmt, "auto")
    assert run_staggered(engine, prompts, params, ARRIVALS) == want


def _run_with_logprobs(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, dict]:
    """Greedy, 16 tokens, the top TOP_LOGPROBS logprobs of each generated token and each prompt token's logprob,
    requests arriving at ARRIVALS' steps."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=TOP_LOGPROBS, prompt_logprobs=1)
    runs = {f"r{i}": {"tokens": [], "logprobs": [], "prompt": None} for i in range(len(prompts))}
    pending, step = list(range(len(prompts))), 0
    while pending or engine.has_unfinished_requests():
        while pending and ARRIVALS[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts[i], params)
        for out in engine.step():
            run = runs[out.request_id]
            run["tokens"] += out.new_token_ids
            run["logprobs"] += out.new_logprobs or []
            if out.prompt_logprobs is not None:
                run["prompt"] = [lp.logprob for lp in out.prompt_logprobs.logprobs]
        step += 1
    return runs


def _noisy_activations(monkeypatch) -> None:
    """The torch reference's fp8 activations moved by ACCUMULATION_NOISE before they are quantized: a fixed
    pseudo-random pattern of each value (no generator: CUDA graphs capture it)."""
    import kernels.quant_matmul as quant_matmul

    quantize = quant_matmul.quantize_fp8_activations_ref

    def noisy(x, group_size=None, *, input_scale=None):
        pattern = torch.sin(x.float() * 7919.0 + torch.arange(x.shape[-1], device=x.device))
        return quantize((x.float() * (1 + ACCUMULATION_NOISE * pattern)).to(x.dtype), group_size,
                        input_scale=input_scale)  # fmt: skip

    monkeypatch.setattr(quant_matmul, "quantize_fp8_activations_ref", noisy)


def _gaps(run: dict, ref: dict, tolerance: float | None) -> tuple[float, float, int]:
    """(largest logprob gap, mean gap, generated tokens compared) of one engine's requests against the
    reference's: every prompt token, and the generated tokens up to each request's first flip. With a tolerance,
    asserts each gap within it and each flip at a reference margin of at most twice it."""
    worst, compared, gaps = 0.0, 0, []
    for rid, want in ref.items():
        got = run[rid]
        assert len(got["prompt"]) == len(want["prompt"])
        for pos, (a, b) in enumerate(zip(got["prompt"], want["prompt"])):
            worst = max(worst, abs(a - b))
            gaps.append(abs(a - b))
            assert tolerance is None or abs(a - b) <= tolerance, f"{rid} prompt token {pos + 1}: {a} against {b}"
        for pos, (token, want_token) in enumerate(zip(got["tokens"], want["tokens"])):
            want_lp = want["logprobs"][pos]
            if token != want_token:
                if tolerance is not None:
                    assert token in want_lp.top, f"{rid} token {pos}: {token} not in the reference's top {TOP_LOGPROBS}"
                    margin = want_lp.top[want_token] - want_lp.top[token]
                    assert margin <= 2 * tolerance, f"{rid} token {pos}: flipped at a margin of {margin:.4f} nats"
                break
            gap = abs(got["logprobs"][pos].logprob - want_lp.logprob)
            worst = max(worst, gap)
            gaps.append(gap)
            assert tolerance is None or gap <= tolerance, f"{rid} token {pos}: logprob {gap:.4f} off the reference's"
            compared += 1
    return worst, sum(gaps) / max(len(gaps), 1), compared


@pytest.mark.parametrize("fmt", W8A8)
def test_triton_fp8_engine_matches_the_torch_references_within_their_noise(
    fmt: str, request, tmp_path: Path, monkeypatch
) -> None:
    build_quantized_checkpoint(fmt, tmp_path / fmt, tokenizer_dir(request))
    prompts = random_prompts(6, 49152, 3, 70, seed=FORMATS.index(fmt))
    want = _run_with_logprobs(_engine(tmp_path / fmt, "torch"), prompts)
    got = _run_with_logprobs(_engine(tmp_path / fmt, "auto"), prompts)
    with monkeypatch.context() as patch:
        _noisy_activations(patch)
        noisy = _run_with_logprobs(_engine(tmp_path / fmt, "torch"), prompts)
    noise, noise_mean, noise_compared = _gaps(noisy, want, None)
    tolerance = max(NOISE_MULTIPLE * noise, LOGPROB_FLOOR)
    worst, mean, compared = _gaps(got, want, tolerance)
    total = sum(len(r["tokens"]) for r in want.values())
    print(f"{fmt}: noise run largest / mean gap {noise:.4f} / {noise_mean:.4f} nats, {noise_compared} tokens "
          f"before its flips; Triton {worst:.4f} / {mean:.4f} (tolerance {tolerance:.4f}), "
          f"{compared} of {total}")  # fmt: skip
    # the mean is steadier than the largest gap: a scale a few percent off shows there first
    assert mean <= NOISE_MULTIPLE * noise_mean + 0.01, f"mean logprob gap {mean:.4f} against noise {noise_mean:.4f}"
    # flips at near ties come as early as the noise run's do (each request diverges at its first): not much earlier
    assert compared >= noise_compared / NOISE_MULTIPLE, (
        f"{compared} of {total} tokens before their request's flip, the noise run {noise_compared}"
    )
