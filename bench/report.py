"""Markdown tables for every benchmark report, and the JSON of the small ones (stdlib only, so any
bench can import it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT_HELP = "output folder (default: $OUT, else bench/results/<gpu>/; bench/results/tmp for a dry run)"


def gpu_folder(device_name: str | None) -> str:
    """The folder of bench/results that holds a device's results: the GPU's model in lower case ('h100' for
    "NVIDIA H100 80GB HBM3", 'h200' for "NVIDIA H200"), 'cpu' for none."""
    if not device_name:
        return "cpu"
    name = device_name.replace("NVIDIA", "")
    model = re.search(r"\b([A-Z]{1,2}\d{1,4}[A-Za-z]?)\b", name)
    return model.group(1).lower() if model else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _first_gpu_name() -> str | None:
    # nvidia-smi, not torch: a CUDA context in a benchmark's parent process would take GPU memory from the
    # worker it starts (bench/service_overhead.py, bench/online_latency.py)
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    names = done.stdout.strip().splitlines()
    return names[0].strip() if names else None


def results_folder(out: str | None, dry_run: bool = False) -> Path:
    """Where a benchmark writes: --out when given, else $OUT (the GPU scripts set it), else
    bench/results/tmp for a dry run (ignored by git), else bench/results/<gpu>/, the committed current
    result of this machine's GPU kind (gpu_folder)."""
    if out:
        return Path(out)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return RESULTS / ("tmp" if dry_run else gpu_folder(_first_gpu_name()))


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
