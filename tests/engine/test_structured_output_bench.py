"""bench/structured_output.py's CPU dry run: every figure it reports is there, the constrained requests ran their
whole max_tokens inside the grammar, and the markdown holds the table."""

from __future__ import annotations

import json

from bench.structured_output import main


def test_dry_run_reports_decode_mask_and_compile_figures(tmp_path):
    results = main(["--dry-run", "--batches", "1,3", "--new-tokens", "10", "--prompt-len", "8", "--out", str(tmp_path)])
    for batch in (1, 3):
        row = results["decode"][batch]
        for mode in ("free", "constrained"):
            assert row[mode]["tokens"] == 10 * batch and row[mode]["full_steps"] >= 5, (batch, mode, row[mode])
            assert row[mode]["ms_per_step"] > 0
    assert results["mask"]["fill_us_per_token_median"] > 0 and results["mask"]["apply_us_batch64_median"] > 0
    for name in ("schema", "json_object", "regex"):
        assert results["compile"][name]["cached_ms"] < results["compile"][name]["cold_ms"]
    saved = json.loads((tmp_path / "structured_output.json").read_text())
    assert set(saved["decode"]) == {"1", "3"}
    assert "| 3 |" in (tmp_path / "structured_output.md").read_text()
