"""Speculative decoding's speed: ms per token with speculation against without it, by mean accepted length.

Random weights cannot show a real proposer's acceptance, so the proposals here have a controlled acceptance: each
request's reference continuation comes first, and the proposer offers its next k tokens with the first `a` of them
right and the rest wrong. Every verification step then keeps a + 1 tokens (the mean accepted length; k + 1 when
a = k).

The reference comes from a run with speculation forced on and blind proposals (tokens chosen without the model,
almost never right), so nearly every reference token is the first row's choice of a verification forward: the
path (multi-token GEMMs, prefill attention) that later verifies the controlled proposals. A non-speculative run
would not do: it computes each token on the decode path (GEMV kernels, decode attention), whose bf16 rounding
breaks the near-ties of random weights' logits differently, so verification rejects "right" proposals, the run
leaves the reference and every later proposal is wrong. A row whose run still leaves the reference shows where
(first token off the reference), and every row shows its decode steps that verified and those the policy left
plain, beside the measured mean accepted length.

    python -m bench.speculative_decode                  # on a CUDA GPU, from the repo root
    python -m bench.speculative_decode --dry-run        # CPU: a tiny shape, code paths only

Per model: batch 1 (a 128-token prompt, NEW_TOKENS greedy tokens) at a = 0..k under the policy's default (which
stops speculating while acceptance is low: most of a = 0's steps decode plainly) and at a = 0 forced on (every
step verifies: the verification's own cost), and batch BATCH (the same per request) at the policy's default (which
turns speculation off above 16 running requests) and forced on at a = 2. A model with a draft in DRAFTS also runs
that draft (random weights) before each proposal, its output replaced by the controlled tokens: the draft's real
cost at a = 0 (forced on), 2 and k. The non-speculative run of each batch is the "off" row.
The packaged SmolLM2 (`default`, real weights) runs the n-gram proposer on a request to repeat a text.
Writes speculative_decode.{json,md} into --out (bench/results/<gpu>/ by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time

from bench.report import OUT_HELP

MODELS = ("Llama-3.1-8B",)  # "default": the packaged SmolLM2 with the n-gram proposer (where installed)
# NOTE: NEW_TOKENS - 1 tokens follow the first (the prefill's), and so do DRY_RUN_NEW_TOKENS - 1; 60 =
# lcm(1..k + 1) divides both, so a run at any a ends on a full verification step and its mean accepted length is
# a + 1 exactly (a proposal never passes max_tokens: a run that ended mid-step would keep fewer on its last step).
PROMPT_LEN, NEW_TOKENS, BATCH, BATCH_TOKENS = 128, 241, 32, 128
DRY_RUN_NEW_TOKENS = 61
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


class BlindProposer:
    """Offers k tokens chosen without the model (consecutive ids from the request's length on): almost never the
    target's choices, so every token of the run but a rare accepted one is a verification forward's first-row
    choice."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def propose(self, requests, budgets):
        return [
            [(r.num_tokens + j) % self.vocab_size for j in range(k)] for r, k in zip(requests, budgets, strict=True)
        ]


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=None, help=OUT_HELP)
    parser.add_argument("--gemv-rows-max", type=int, default=None,
                        help="engine.ops.GEMV_ROWS_MAX for an A/B of the few-rows kernels (0: off)")  # fmt: skip
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


def _run(engine, prompts: dict[str, list[int]], new_tokens: int) -> tuple[dict[str, list[int]], float, int, int]:
    """Greedy requests to the end: (tokens per request, seconds from the first token's arrival to the last's,
    tokens after the first ones, steps that scheduled decodes only: verifying or plain)."""
    from engine.sampling_params import SamplingParams

    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    first = last = None
    decode_steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        step = engine.last_step
        decode_steps += bool(step.scheduled) and step.num_prefill_tokens == 0
        for out in outputs:
            tokens[out.request_id] += out.new_token_ids
        if outputs and all(tokens.values()):
            first = first or now
            last = now
    decoded = sum(len(t) - 1 for t in tokens.values())
    return tokens, (last - first), decoded, decode_steps


def _forced(policy, max_num_seqs: int):
    """The policy with speculation forced on: every step of up to max_num_seqs requests verifies."""
    return dataclasses.replace(policy, max_batch_size=max_num_seqs, min_acceptance_rate=0.0)


def _speculation(engine, speculator, proposer=None, policy=None) -> None:
    """Speculation off (speculator None) or on with this proposer and policy (a SpeculativeConfig)."""
    engine.speculator = speculator
    if speculator is not None:
        speculator.proposer = proposer
        speculator.config = policy
        speculator.recent_acceptance_rate = 1.0


def _off_reference(tokens: dict[str, list[int]], reference: dict[str, list[int]]) -> tuple[int | None, int]:
    """(the first output index at which a request's tokens leave its reference, None when none does; how many
    requests leave it)."""
    firsts = [next((i for i, (t, r) in enumerate(zip(out, reference[rid])) if t != r), None)
              for rid, out in tokens.items()]  # fmt: skip
    off = [i for i in firsts if i is not None]
    return (min(off) if off else None), len(off)


def _timed(engine, prompts, new_tokens: int, repeats: int, reference=None) -> tuple[float, dict, dict]:
    """(median ms per decoded token of one request over `repeats` runs, the runs' counters, the last run's tokens).
    The counters: speculation's (drafts, accepted, mean accepted length), decode steps per run that verified and
    that decoded plainly, and against `reference` the first token off it and the requests that leave it."""
    from bench.engine_common import median

    spec = engine.speculator
    before, verifying_before = engine.stats(), spec.stats.num_steps if spec else 0
    per_token, decode_steps, firsts, num_off = [], 0, [], 0
    for _ in range(repeats):
        tokens, seconds, decoded, steps = _run(engine, prompts, new_tokens)
        per_token.append(1000 * seconds / (decoded / len(prompts)))
        decode_steps += steps
        if reference is not None:
            first, off = _off_reference(tokens, reference)
            firsts += [] if first is None else [first]
            num_off = max(num_off, off)
    after = engine.stats()
    drafts = after.spec_num_drafts - before.spec_num_drafts
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    verifying = (spec.stats.num_steps if spec else 0) - verifying_before
    # a verifying step may also carry another request's prefill chunk: not a decode-only step, so plain steps are
    # the decode-only steps past the verifying ones, at least none
    plain = max(0, decode_steps - verifying)
    counters = {"drafts": drafts, "accepted": accepted,
                "mean_accepted_length": 1 + accepted / drafts if drafts else None,
                "verify_steps": verifying / repeats, "plain_steps": plain / repeats}  # fmt: skip
    if reference is not None:
        counters |= {"first_off_reference": min(firsts) if firsts else None, "requests_off_reference": num_off}
    return median(per_token), counters, tokens


def _reference(engine, speculator, prompts, new_tokens: int, policy, vocab: int) -> tuple[dict, dict]:
    """Each request's greedy continuation as verification computes it (module docstring): (tokens, counters)."""
    _speculation(engine, speculator, BlindProposer(vocab), policy)
    _, counters, tokens = _timed(engine, prompts, new_tokens, 1)
    return tokens, {k: counters[k] for k in ("drafts", "accepted", "verify_steps", "plain_steps")}


def _controlled_row(engine, speculator, prompts, tokens: int, repeats: int, reference, proposer, config,
                    off_ms: float, **fields) -> dict:  # fmt: skip
    """One row: requests of `tokens` tokens with this proposer under this policy (config), against the reference;
    fields label the row (correct: a, policy, draft)."""
    _speculation(engine, speculator, proposer, config)
    _timed(engine, prompts, 16 if len(prompts) == 1 else 8, 1)  # warm-up: the verification step's shapes
    ms, counters, _ = _timed(engine, prompts, tokens, repeats, reference)
    return {"batch": len(prompts), **fields, "target_length": float(min(fields["correct"] + 1, K + 1)),
            "ms_per_token": ms, "speedup": off_ms / ms, **counters}  # fmt: skip


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
    default = speculator.config
    new_tokens = DRY_RUN_NEW_TOKENS if dry_run else NEW_TOKENS
    repeats = 1 if dry_run else 3
    rng = random.Random(0)
    one = {"b0": [rng.randrange(vocab) for _ in range(PROMPT_LEN)]}
    forced = _forced(default, 1)
    _reference(engine, speculator, one, 16, forced, vocab)  # warm-up: the verification step's shapes
    reference, counters = _reference(engine, speculator, one, new_tokens + K + 1, forced, vocab)
    references = [{"batch": 1, **counters}]
    _speculation(engine, None)
    _timed(engine, one, 16, 1)  # warm-up
    off_ms, counters, _ = _timed(engine, one, new_tokens, repeats, reference)
    rows = [{"batch": 1, "correct": None, "target_length": 1.0, "ms_per_token": off_ms, "speedup": 1.0, **counters}]
    # (proposer, policy, row labels): a = 0..k under the policy, then a = 0 forced on (every step verifies)
    runs = [(ControlledProposer(reference, a, vocab), default, {"correct": a}) for a in range(K + 1)]
    runs.append((ControlledProposer(reference, 0, vocab), forced, {"correct": 0, "policy": "forced on"}))
    if draft is not None:  # the draft's real cost at the controlled acceptances
        for a in (0, 2, K):
            proposer = DraftCostProposer(draft, ControlledProposer(reference, a, vocab))
            # at a = 0 the policy would leave most steps plain, the draft idle: its cost needs every step to verify
            labels = {"correct": a, "draft": draft_name} | ({"policy": "forced on"} if a == 0 else {})
            runs.append((proposer, forced if a == 0 else default, labels))
    batch = 20 if dry_run else BATCH  # above the policy's default limit of 16 either way
    batch_tokens = 8 if dry_run else BATCH_TOKENS
    many = {f"b{i}": [rng.randrange(vocab) for _ in range(PROMPT_LEN)] for i in range(batch)}
    for proposer, policy, labels in runs:
        rows.append(_controlled_row(engine, speculator, one, new_tokens, repeats, reference, proposer, policy, off_ms,
                                    **labels))  # fmt: skip
        print(f"[spec] {name} {rows[-1]}")
    reference, counters = _reference(engine, speculator, many, batch_tokens + K + 1, _forced(default, batch), vocab)
    references.append({"batch": batch, **counters})
    _speculation(engine, None)
    off_ms, counters, _ = _timed(engine, many, batch_tokens, repeats, reference)
    rows.append({"batch": batch, "correct": None, "target_length": 1.0, "ms_per_token": off_ms, "speedup": 1.0,
                 **counters})  # fmt: skip
    for label, policy in (("policy default", default), ("forced on", _forced(default, batch))):
        proposer = ControlledProposer(reference, 2, vocab)
        rows.append(_controlled_row(engine, speculator, many, batch_tokens, repeats, reference, proposer, policy,
                                    off_ms, correct=2, policy=label))  # fmt: skip
        print(f"[spec] {name} {rows[-1]}")
    del engine
    from bench.engine_common import free_device_memory

    free_device_memory(device)
    return {"k": K, "prompt_len": PROMPT_LEN, "new_tokens": new_tokens, "references": references, "rows": rows}


def _measure_ngram_on_smollm2(device, dry_run: bool) -> dict:
    """The n-gram proposer on real text: the packaged SmolLM2 asked to repeat a function."""
    engine = _engine("default", device, dry_run, dummy=False)
    speculator = engine.speculator
    prompt = {"copy": engine.apply_chat_template([{"role": "user", "content": f"Repeat exactly:\n{COPY_TEXT}"}])}
    new_tokens = 24 if dry_run else 160
    repeats = 1 if dry_run else 3
    _speculation(engine, None)
    _timed(engine, prompt, 16, 1)
    off_ms, _, _ = _timed(engine, prompt, new_tokens, repeats)
    from engine.proposers import NgramProposer

    rows = [{"batch": 1, "proposer": "off", "ms_per_token": off_ms, "speedup": 1.0}]
    default = speculator.config
    # the policy's default, and forced on: every step verifies what the proposer finds (the policy's worth)
    for label, policy in (("policy default", default), ("forced on", _forced(default, 1))):
        _speculation(engine, speculator, NgramProposer(), policy)
        _timed(engine, prompt, 16, 1)
        ms, spec, _ = _timed(engine, prompt, new_tokens, repeats)
        rows.append({"batch": 1, "proposer": "ngram", "policy": label, "ms_per_token": ms, "speedup": off_ms / ms,
                     **spec})  # fmt: skip
        print(f"[spec] default {rows[-1]}")
    return {"k": K, "rows": rows}


def _steps(row: dict) -> str:
    verify, plain = row.get("verify_steps"), row.get("plain_steps")
    return "" if verify is None else f"{verify:g} / {plain:g}"


def _off_reference_cell(row: dict) -> str:
    if "first_off_reference" not in row:
        return ""
    first = row["first_off_reference"]
    if first is None:
        return "none"
    return f"{first}" if row["batch"] == 1 else f"{first} ({row['requests_off_reference']} of {row['batch']})"


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
        for ref in model.get("references", []):
            lines.append(f"Reference at batch {ref['batch']}: {ref['verify_steps']:g} decode steps verified blind "
                         f"proposals (tokens accepted by chance: {ref['accepted']}), {ref['plain_steps']:g} decoded "
                         "plainly.")  # fmt: skip
        lines += ["", "Decode steps: per run, those that verified proposals / those that decoded plainly. First token "
                  "off the reference: the first output index at which a run's tokens differ from the reference "
                  "(at a batch, and how many requests differ).", ""] if model.get("references") else []  # fmt: skip
        lines += ["| batch | proposals | intended accepted length | measured | decode steps verified / plain | "
                  "first token off the reference | ms/token | speedup |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in model["rows"]:
            what = row.get("proposer") or ("off" if row.get("correct") is None else f"{row['correct']} of {K} right")
            if row.get("policy"):
                what += f", {row['policy']}"
            if row.get("draft"):
                what += f", after the {row['draft']} draft's {K} steps"
            measured = row.get("mean_accepted_length")
            lines.append(
                f"| {row['batch']} | {what} | {row.get('target_length', '')} | "
                f"{'' if measured is None else f'{measured:.2f}'} | {_steps(row)} | {_off_reference_cell(row)} | "
                f"{row['ms_per_token']:.2f} | {row['speedup']:.2f}x |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from bench.engine_common import run_model_benchmark

    args = _parse_args(argv)
    if args.gemv_rows_max is not None:
        from engine import ops

        ops.GEMV_ROWS_MAX = args.gemv_rows_max  # recorded in the results' environment
    return run_model_benchmark("spec", STEM, args, measure_model, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
