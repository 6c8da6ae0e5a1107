"""bench/plot.py draws every chart docs/benchmarks.md shows from the committed results."""

from __future__ import annotations

import re
from pathlib import Path

from bench.plot import main

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "h100"


def test_the_documented_charts_are_drawn_from_the_committed_results(tmp_path) -> None:
    written = main(["--results", str(RESULTS), "--out", str(tmp_path)])
    names = {path.name for path in written}
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\(\.\./bench/results/h100/([^)]+\.png)\)", page))
    assert shown and shown <= names, (shown, names)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
        assert (RESULTS / path.name).is_file()  # the committed chart the README links
