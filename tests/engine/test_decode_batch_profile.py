"""bench/decode_batch_profile.py: the offline workload's decode batch at a step, and a dry run on the CPU
that profiles exactly that batch (the check that stopped a first version whose sequences finished
inside the profile, leaving smaller batches than labelled)."""

from __future__ import annotations

import json

from bench.decode_batch_profile import main, offline_batch
from bench.offline_throughput import MAX_LEN, MIN_LEN, NUM_SEQS, workload


def test_the_batch_of_a_step_is_the_workload_sequences_still_running_at_their_context_then():
    _, prompt_lens, output_lens = workload(1000, NUM_SEQS, MIN_LEN, MAX_LEN)
    step = 600
    batch = offline_batch(1000, step, dry_run=False)
    running = [p for p, o in zip(prompt_lens, output_lens, strict=True) if o > step]
    assert [len(p) for p in batch] == [p + step for p in running]
    assert 0 < len(batch) < NUM_SEQS
    assert len(offline_batch(1000, 1, dry_run=False)) == NUM_SEQS  # every output is at least 100 long


def test_dry_run_profiles_whole_decode_batches(tmp_path):
    main(["--dry-run", "--models", "Qwen3-0.6B", "--steps-at", "1,10", "--profile-steps", "3", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "decode_batch_profile.json").read_text())
    rows = results["models"]["Qwen3-0.6B"]["rows"]
    assert [(r["step"], r["batch"]) for r in rows] == [(1, 6), (10, len(offline_batch(512, 10, dry_run=True)))]
    for r in rows:
        assert r["keys"] > 0 and r["floors_us"]["step"] >= r["floors_us"]["attention"] > 0
    assert "## Qwen3-0.6B" in (tmp_path / "decode_batch_profile.md").read_text()
