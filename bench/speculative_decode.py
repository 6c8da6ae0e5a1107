"""Speculative decoding's speed: ms per token with speculation against without it, by mean accepted length.

Random weights cannot show a real proposer's acceptance, so the proposals here have a controlled acceptance: a
non-speculative greedy run gives each request's own continuation, and the proposer offers its next k tokens with
the first `a` of them right and the rest wrong. Every verification step then keeps a + 1 tokens (the mean accepted
length; k + 1 when a = k), unless the verification forward's bf16 logits break a near-tie differently than the
decode kernel did (the report gives the measured mean accepted length beside the intended one).

    python -m bench.speculative_decode                  # on a CUDA GPU, from the repo root
    python -m bench.speculative_decode --dry-run        # CPU: a tiny shape, code paths only

Per model: batch 1 (a 128-token prompt, NEW_TOKENS greedy tokens) at a = 0..k, and batch BATCH (the same per
request) at the policy's default (which turns speculation off above 16 running requests) and forced on at a = 2.
A model with a draft in DRAFTS also runs that draft (random weights) before each proposal, its output replaced by
the controlled tokens: the draft's real cost at a = 0, 2 and k.
The packaged SmolLM2 (`default`, real weights) runs the n-gram proposer on a request to repeat a text.
Writes speculative_decode.{json,md} into --out (bench/results/<gpu>/ by default).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from bench.report import OUT_HELP

MODELS = ("Llama-3.1-8B",)  # "default": the packaged SmolLM2 with the n-gram proposer (where installed)
PROMPT_LEN, NEW_TOKENS, BATCH, BATCH_TOKENS = 128, 256, 32, 128
K = 4
STEM = "speculative_decode"
COPY_TEXT = (
    "def merge_sorted(left, right):\n    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            result.append(left[i])\n            i += 1\n        else:\n"
    "            result.append(right[j])\n            j += 1\n    result.extend(left[i:])\n"
    "    result.extend(right[j:])\n    return result\n"
)


class ControlledProposer:
    """Offers each request's reference continuation after its current output: the first `correct` tokens right,
    the rest off by one (wrong)."""

    def __init__(self, reference: dict[str, list[int]], correct: int, vocab_size: int) -> None:
        self.reference, self.correct, self.vocab_size = reference, correct, vocab_size

    def propose(self, requests, budgets):
        out = []
        for request, k in zip(requests, budgets, strict=True):
            start = request.num_output_tokens
            tokens = self.reference[request.request_id][start : start + k]
            out.append([t if j < self.correct else (t + 1) % self.vocab_size for j, t in enumerate(tokens)])
        return out


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, few tokens")
    parser.add_argument("--skip-hf", action="store_true", help="accepted for the shared driver; no peer runs here")
    return parser.parse_args(argv)


DRAFTS = {"Llama-3.1-8B": "Llama-3.2-1B"}  # the draft of a model, bench/configs names (random weights too)


class DraftCostProposer:
    """Runs the real draft proposer (its full cost: k draft forwards and its KV bookkeeping), then proposes the
    controlled tokens instead of the random draft's: the draft's cost at a known acceptance."""

    def __init__(self, draft, controlled: ControlledProposer) -> None:
        self.draft, self.controlled = draft, controlled

    def propose(self, requests, budgets):
        self.draft.propose(requests, budgets)
        return self.controlled.propose(requests, budgets)


def _engine(directory, device, dry_run: bool, *, dummy: bool = True, max_num_seqs: int = BATCH, draft=None):
    from bench.engine_common import async_scheduling_setting
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
    from engine.llm_engine import LLMEngine

    dtype = "float32" if dry_run else "bfloat16"
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=str(directory), dtype=dtype, load_format="dummy" if dummy else "auto", max_model_len=1024
            ),
            # no prefix caching: every run prefills its prompt as a fresh request would
            cache=CacheConfig(num_kv_tokens=max_num_seqs * 512, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=2048),
            device=device.type,
            async_scheduling=async_scheduling_setting(),
            speculative=SpeculativeConfig(
                method="draft" if draft else "ngram",
                num_speculative_tokens=K,
                draft_model=str(draft) if draft else None,
                draft_load_format="dummy",
                draft_num_kv_tokens=max_num_seqs * 512,
            ),
        )
    )


def _run(engine, prompts: dict[str, list[int]], new_tokens: int) -> tuple[dict[str, list[int]], float, int]:
    """Greedy requests to the end: (tokens per request, seconds from the first token's arrival to the last's,
    tokens after the first ones)."""
    from engine.sampling_params import SamplingParams

    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    first = last = None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            tokens[out.request_id] += out.new_token_ids
        if outputs and all(tokens.values()):
            first = first or now
            last = now
    decoded = sum(len(t) - 1 for t in tokens.values())
    return tokens, (last - first), decoded


def _speculation(engine, speculator, proposer=None, max_batch_size: int | None = None) -> None:
    """Speculation off (speculator None) or on with this proposer and policy."""
    import dataclasses

    engine.speculator = speculator
    if speculator is not None:
        speculator.proposer = proposer
        if max_batch_size is not None:
            speculator.config = dataclasses.replace(speculator.config, max_batch_size=max_batch_size)
        speculator.recent_acceptance_rate = 1.0


def _timed(engine, prompts, new_tokens: int, repeats: int) -> tuple[float, dict]:
    """(median ms per decoded token of one request over `repeats` runs, the speculation counters of the runs)."""
    from bench.engine_common import median

    before = engine.stats()
    per_token = []
    for _ in range(repeats):
        _, seconds, decoded = _run(engine, prompts, new_tokens)
        per_token.append(1000 * seconds / (decoded / len(prompts)))
    after = engine.stats()
    drafts = after.spec_num_drafts - before.spec_num_drafts
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    spec = {"drafts": drafts, "accepted": accepted, "mean_accepted_length": 1 + accepted / drafts if drafts else None}
    return median(per_token), spec


def measure_model(name: str, device, ceilings: dict, dry_run: bool, skip_hf: bool) -> dict:
    if name == "default":
        return _measure_ngram_on_smollm2(device, dry_run)
    from bench.engine_common import model_dir, vocab_size_of

    directory = model_dir(name, tiny=dry_run)
    vocab = vocab_size_of(directory)
    draft_name = DRAFTS.get(name)
    engine = _engine(directory, device, dry_run, draft=model_dir(draft_name, tiny=dry_run) if draft_name else None)
    speculator = engine.speculator
    draft = speculator.proposer if draft_name else None
    new_tokens = 16 if dry_run else NEW_TOKENS
    repeats = 1 if dry_run else 3
    rng = random.Random(0)
    one = {"b0": [rng.randrange(vocab) for _ in range(PROMPT_LEN)]}
    _speculation(engine, None)
    reference, _, _ = _run(engine, one, new_tokens + K + 1)
    _timed(engine, one, 16, 1)  # warm-up
    off_ms, _ = _timed(engine, one, new_tokens, repeats)
    rows = [{"batch": 1, "correct": None, "target_length": 1.0, "ms_per_token": off_ms, "speedup": 1.0}]
    for correct in range(K + 1):
        _speculation(engine, speculator, ControlledProposer(reference, correct, vocab))
        _timed(engine, one, 16, 1)  # warm-up: the verification step's shapes
        ms, spec = _timed(engine, one, new_tokens, repeats)
        rows.append({"batch": 1, "correct": correct, "target_length": float(min(correct + 1, K + 1)),
                     "ms_per_token": ms, "speedup": off_ms / ms, **spec})  # fmt: skip
        print(f"[spec] {name} batch 1, {correct} right of {K}: {ms:.2f} ms/token ({off_ms / ms:.2f}x) {spec}")
    if draft is not None:  # the draft's real cost at the controlled acceptances
        for correct in (0, 2, K):
            _speculation(engine, speculator, DraftCostProposer(draft, ControlledProposer(reference, correct, vocab)))
            _timed(engine, one, 16, 1)
            ms, spec = _timed(engine, one, new_tokens, repeats)
            length = float(min(correct + 1, K + 1))
            rows.append({"batch": 1, "correct": correct, "draft": draft_name, "target_length": length,
                         "ms_per_token": ms, "speedup": off_ms / ms, **spec})  # fmt: skip
            print(f"[spec] {name} batch 1, draft {draft_name}, {correct} right: {ms:.2f} ms/token, {off_ms / ms:.2f}x")
    batch = 20 if dry_run else BATCH  # above the policy's default limit of 16 either way
    batch_tokens = 8 if dry_run else BATCH_TOKENS
    many = {f"b{i}": [rng.randrange(vocab) for _ in range(PROMPT_LEN)] for i in range(batch)}
    _speculation(engine, None)
    reference, _, _ = _run(engine, many, batch_tokens + K + 1)
    off_ms, _ = _timed(engine, many, batch_tokens, repeats)
    rows.append({"batch": batch, "correct": None, "target_length": 1.0, "ms_per_token": off_ms, "speedup": 1.0})
    for label, max_batch in (("policy default", None), ("forced on", batch)):
        _speculation(engine, speculator, ControlledProposer(reference, 2, vocab), max_batch)
        _timed(engine, many, 8, 1)
        ms, spec = _timed(engine, many, batch_tokens, repeats)
        rows.append({"batch": batch, "correct": 2, "policy": label, "target_length": 3.0, "ms_per_token": ms,
                     "speedup": off_ms / ms, **spec})  # fmt: skip
        print(f"[spec] {name} batch {batch}, {label}: {ms:.2f} ms/token ({off_ms / ms:.2f}x) {spec}")
    del engine
    from bench.engine_common import free_device_memory

    free_device_memory(device)
    return {"k": K, "prompt_len": PROMPT_LEN, "rows": rows}


def _measure_ngram_on_smollm2(device, dry_run: bool) -> dict:
    """The n-gram proposer on real text: the packaged SmolLM2 asked to repeat a function."""
    engine = _engine("default", device, dry_run, dummy=False)
    speculator = engine.speculator
    prompt = {"copy": engine.apply_chat_template([{"role": "user", "content": f"Repeat exactly:\n{COPY_TEXT}"}])}
    new_tokens = 24 if dry_run else 160
    repeats = 1 if dry_run else 3
    _speculation(engine, None)
    _timed(engine, prompt, 16, 1)
    off_ms, _ = _timed(engine, prompt, new_tokens, repeats)
    from engine.proposers import NgramProposer

    _speculation(engine, speculator, NgramProposer())
    _timed(engine, prompt, 16, 1)
    ms, spec = _timed(engine, prompt, new_tokens, repeats)
    rows = [
        {"batch": 1, "proposer": "off", "ms_per_token": off_ms, "speedup": 1.0},
        {"batch": 1, "proposer": "ngram", "ms_per_token": ms, "speedup": off_ms / ms, **spec},
    ]
    return {"k": K, "rows": rows}


def markdown(results: dict) -> str:
    from bench.engine_common import header

    lines = header(results, "Speculative decoding: ms/token by mean accepted length")
    lines += ["", f"k = {K} proposed tokens; greedy; controlled acceptance (module docstring) on random weights, the "
              "n-gram proposer on the packaged SmolLM2's real weights.", ""]  # fmt: skip
    for name, model in results["models"].items():
        lines += [f"## {name}", ""]
        if "error" in model:
            lines += [f"error: {model['error']}", ""]
            continue
        lines += ["| batch | proposals | intended accepted length | measured | ms/token | speedup |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for row in model["rows"]:
            what = row.get("proposer") or ("off" if row.get("correct") is None else f"{row['correct']} of {K} right")
            if row.get("policy"):
                what += f", {row['policy']}"
            if row.get("draft"):
                what += f", after the {row['draft']} draft's {K} steps"
            measured = row.get("mean_accepted_length")
            lines.append(
                f"| {row['batch']} | {what} | {row.get('target_length', '')} | "
                f"{'' if measured is None else f'{measured:.2f}'} | {row['ms_per_token']:.2f} | {row['speedup']:.2f}x |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import run_model_benchmark

    return run_model_benchmark("spec", STEM, _parse_args(argv), measure_model, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
