"""PNG charts of committed engine benchmark results (matplotlib).

    python -m bench.plot --results bench/results/h100 [--out bench/results/h100]

Reads decode_latency.json, offline_throughput.json, hf_full_workload.json and service_overhead.json
where present and writes decode_latency.png (ms/token: inferq with and without CUDA graphs,
transformers, the floor and the goal), offline_throughput.png (output tok/s: inferq, the roofline,
transformers measured on its subset and extrapolated), hf_full_workload.png (the offline engine against
transformers over the whole workload, with the 20x goal) and service_overhead.png (output tok/s of the
offline engine and of the service at each seed, with the 95% goal; TTFT p50 of both at low load, with
the service's goal).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DECODE_GOALS_MS = {"Llama-3.2-1B": 1.0, "Llama-3.1-8B": 5.9}
# bench/hf_full_workload.py's batch orders, as the peer chart's legend names them
ORDER_LABELS = {"arrival": "workload order, as vLLM's hf baseline", "by_output": "grouped by output length"}
PEER_GOAL_RATIO = 20  # the offline engine >= 20x transformers measured on the same machine


def _subtitle(results: dict) -> str:
    meta = results["meta"]
    return f"{meta['gpu']} · {meta['date'][:10]} · torch {meta['torch']} · triton {meta['triton']}"


def _bars(ax, groups: list[str], series: list[tuple[str, list[float | None]]], unit: str) -> None:
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        for bar, value in zip(bars, values, strict=True):
            if value is not None:
                label = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_decode(results: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    models = [m for m, r in results["models"].items() if "error" not in r]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = [
        ("inferq, CUDA graphs", [results["models"][m]["graphs_on"]["ms_per_token"] for m in models]),
        ("inferq, eager", [results["models"][m]["graphs_off"]["ms_per_token"] for m in models]),
        ("floor (read BW)", [results["models"][m]["floor_ms_per_token"] for m in models]),
        ("goal", [DECODE_GOALS_MS.get(m) for m in models]),
    ]
    if all("hf_ms_per_token" in results["models"][m] for m in models):
        series.insert(2, ("transformers eager", [results["models"][m]["hf_ms_per_token"] for m in models]))
    _bars(ax, models, series, "ms per token (lower is better)")
    ax.set_yscale("log")
    ax.set_title(f"Batch-1 decode latency, 128-token prompt, 512 new tokens\n{_subtitle(results)}", fontsize=9)
    return _save(fig, out / "decode_latency.png")


def plot_offline(results: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    models = [m for m, r in results["models"].items() if "error" not in r]
    rows = [results["models"][m] for m in models]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = [
        ("inferq", [r["output_tok_s"] for r in rows]),
        ("roofline", [r["output_tokens"] / r["roofline"]["floor_s"] for r in rows]),
    ]
    if all("hf_subset_output_tok_s" in r for r in rows):
        series.append(("transformers (64-seq subset)", [r["hf_subset_output_tok_s"] for r in rows]))
        series.append(("transformers (extrapolated)", [r["hf_extrapolated_output_tok_s"] for r in rows]))
    _bars(ax, models, series, "output tokens / s (higher is better)")
    ax.set_yscale("log")
    ax.set_title(f"Offline throughput, 256 sequences, lengths uniform in [100, 1024]\n{_subtitle(results)}", fontsize=9)
    return _save(fig, out / "offline_throughput.png")


def plot_peer(results: dict, out: Path) -> Path:
    """The offline engine against transformers over the whole workload, both measured on one machine."""
    import matplotlib.pyplot as plt

    models = [m for m, r in results["models"].items() if r["summary"].get("engine_x_peer")]
    rows = [results["models"][m]["summary"] for m in models]
    kinds = sorted({(results["models"][m]["order"], "warm" if results["models"][m].get("warm_up_s") else "cold")
                    for m in models})  # fmt: skip
    peer = "; ".join(f"{ORDER_LABELS.get(order, order)}, {process}" for order, process in kinds)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    _bars(ax, models, [
        ("inferq offline engine", [r["engine_output_tok_s"] for r in rows]),
        (f"goal ({PEER_GOAL_RATIO}x transformers)", [PEER_GOAL_RATIO * r["output_tok_s"] for r in rows]),
        (f"transformers generate, batches of 64 ({peer})", [r["output_tok_s"] for r in rows]),
    ], "output tokens / s (higher is better)")  # fmt: skip
    ax.set_yscale("log")
    ratios = ", ".join(f"{m} {r['engine_x_peer']:.1f}x" for m, r in zip(models, rows, strict=True))
    ax.set_title(f"Offline workload, inferq against transformers on the same machine: {ratios}\n"
                 f"{_subtitle(results)}", fontsize=9)  # fmt: skip
    return _save(fig, out / "hf_full_workload.png")


def plot_service(results: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    offline, service = results["offline"]["runs"], results["service"]["runs"]
    seeds = [f"seed {run['seed']}" for run in offline]
    goal = results["goals"]["throughput_frac"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.5), gridspec_kw={"width_ratios": [3, 1.4]})
    _bars(left, seeds, [
        ("offline engine", [run["output_tok_s"] for run in offline]),
        ("service (HTTP + Redis + worker)", [run["output_tok_s"] for run in service]),
        (f"goal ({goal:.0%} of offline)", [goal * run["output_tok_s"] for run in offline]),
    ], "output tokens / s (higher is better)")  # fmt: skip
    fraction = results["throughput_frac_of_offline"]
    left.set_title(f"Throughput: the service at {fraction:.1%} of the offline engine (medians)", fontsize=9)
    ttft = results["ttft_p50_ms"]
    _bars(right, ["TTFT p50, low load"], [
        ("offline engine", [ttft["offline"]]),
        ("service", [ttft["service"]]),
        ("goal (offline + 5 ms)", [ttft["offline"] + results["goals"]["added_ttft_p50_ms"]]),
    ], "ms (lower is better)")  # fmt: skip
    right.set_title(f"added by the service: {ttft['added']:.1f} ms", fontsize=9)
    fig.suptitle(f"Service overhead, {results['model']} shape, 256 streaming clients\n{_subtitle(results)}", fontsize=9)
    return _save(fig, out / "service_overhead.png")


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("bench/results/h100"))
    parser.add_argument("--out", type=Path, default=None, help="default: the results folder")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    out = args.out or args.results
    out.mkdir(parents=True, exist_ok=True)
    written = []
    plots = (("decode_latency", plot_decode), ("offline_throughput", plot_offline),
             ("hf_full_workload", plot_peer), ("service_overhead", plot_service))  # fmt: skip
    for stem, plot in plots:
        source = args.results / f"{stem}.json"
        if source.is_file():
            written.append(plot(json.loads(source.read_text()), out))
    print("wrote", [str(p) for p in written])
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
