"""bench/speculative_decode.py's CPU dry run: the controlled proposals give the intended mean accepted lengths (with
and without the draft model's steps before them), and the policy turns speculation off at a batch above its
limit."""

from __future__ import annotations

import json

from bench import speculative_decode


def test_dry_run_reaches_the_intended_accepted_lengths(tmp_path) -> None:
    results = speculative_decode.main(["--dry-run", "--models", "Llama-3.1-8B", "--out", str(tmp_path)])
    rows = results["models"]["Llama-3.1-8B"]["rows"]
    single = [r for r in rows if r["batch"] == 1 and r["correct"] is not None and "draft" not in r]
    with_draft = [r for r in rows if "draft" in r]  # the Llama-3.2-1B shape's draft run before each proposal
    assert [r["draft"] for r in with_draft] == ["Llama-3.2-1B"] * 3
    assert [round(r["mean_accepted_length"]) for r in with_draft] == [1, 3, 5]
    # 16 tokens: a proposal never passes max_tokens, so the last steps of a run may keep fewer than intended
    assert [round(r["mean_accepted_length"]) for r in single] == [1, 2, 3, 4, 5]
    assert all(r["mean_accepted_length"] <= r["target_length"] for r in single)
    batched = {r.get("policy"): r for r in rows if r["batch"] == 20}
    # the policy speculates only at the edges: before the batch fills (16 prompts of 128 tokens take a step's
    # 2048-token budget; the other 4 join the next step, whose decodes still see 16 running) and once the first
    # 16 have finished
    assert batched["policy default"]["drafts"] <= 20 < batched["forced on"]["drafts"]
    assert batched["forced on"]["mean_accepted_length"] == 3.0
    assert json.loads((tmp_path / "speculative_decode.json").read_text())["models"]["Llama-3.1-8B"]["k"] == 4
    assert "| 1 | 2 of 4 right | 3.0 | 3.00 |" in (tmp_path / "speculative_decode.md").read_text()
