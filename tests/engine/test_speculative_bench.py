"""bench/speculative_decode.py's CPU dry run: the controlled proposals give the intended mean accepted lengths (with
and without the draft model's steps before them) and every run follows the reference, the policy leaves most steps
plain at no acceptance and turns speculation off at a batch above its limit, and forced on it verifies every step."""

from __future__ import annotations

import json

from bench import speculative_decode


def test_dry_run_reaches_the_intended_accepted_lengths(tmp_path) -> None:
    results = speculative_decode.main(["--dry-run", "--models", "Llama-3.1-8B", "--out", str(tmp_path)])
    rows = results["models"]["Llama-3.1-8B"]["rows"]
    single = [r for r in rows if r["batch"] == 1 and r["correct"] is not None and "draft" not in r]
    with_draft = [r for r in rows if "draft" in r]  # the Llama-3.2-1B shape's draft run before each proposal
    assert [r["draft"] for r in with_draft] == ["Llama-3.2-1B"] * 3
    assert [r["mean_accepted_length"] for r in with_draft] == [1.0, 3.0, 5.0]
    # 60 tokens after the first: every a ends on a full step, so each run keeps exactly a + 1 a step
    assert [r["mean_accepted_length"] for r in single] == [1.0, 2.0, 3.0, 4.0, 5.0, 1.0]
    assert [r["target_length"] for r in single] == [1.0, 2.0, 3.0, 4.0, 5.0, 1.0]
    assert all(r["first_off_reference"] is None for r in single + with_draft)
    assert [r["plain_steps"] for r in single[1:5]] == [0.0] * 4
    # at a = 0 the policy leaves most steps plain; forced on, every step verifies but the last (one token left)
    policy_zero, forced_zero = single[0], single[5]
    assert forced_zero["policy"] == "forced on" and "policy" not in policy_zero
    assert policy_zero["plain_steps"] > policy_zero["verify_steps"]
    assert (forced_zero["verify_steps"], forced_zero["plain_steps"]) == (59.0, 1.0)
    assert [ref["batch"] for ref in results["models"]["Llama-3.1-8B"]["references"]] == [1, 20]
    batched = {r.get("policy"): r for r in rows if r["batch"] == 20}
    # the policy speculates only at the edges: before the batch fills (16 prompts of 128 tokens take a step's
    # 2048-token budget; the other 4 join the next step, whose decodes still see 16 running) and once the first
    # 16 have finished
    assert batched["policy default"]["drafts"] <= 20 < batched["forced on"]["drafts"]
    assert batched["forced on"]["mean_accepted_length"] == 3.0
    assert json.loads((tmp_path / "speculative_decode.json").read_text())["models"]["Llama-3.1-8B"]["k"] == 4
    assert "| 1 | 2 of 4 right | 3.0 | 3.00 | 20 / 0 | none |" in (tmp_path / "speculative_decode.md").read_text()
