"""Markdown tables for every benchmark report, and the JSON of the small ones (stdlib only, so any
bench can import it)."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(out: Path | str, name: str, result: dict) -> None:
    """`result` as `name` in the folder `out` (made if missing), and printed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    (out / name).write_text(text)
    print(text)


def table(rows: list[dict], columns: list[tuple[str, str, str]], drop_absent: bool = False) -> str:
    """Markdown table of rows; columns are (key, header, format spec); a missing value prints '-'.

    Args:
        drop_absent: leave out a column that no row has (a peer a dry run cannot measure, say).
    """
    if drop_absent:
        columns = [c for c in columns if any(c[0] in row for row in rows)]
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for key, _, spec in columns:
            value = row.get(key)
            cells.append("-" if value is None else format(value, spec) if spec else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
