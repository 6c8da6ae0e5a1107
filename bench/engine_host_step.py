"""The engine's own Python per full-batch decode step, piece by piece, without a GPU.

    python -m bench.engine_host_step            # writes engine_host_step.{json,md} into $OUT

Why: on the H100 hosts the engine's host work per 256-row decode step (schedule, stage, launch, read, turn
tokens into outputs) is what a slower host runs past the GPU with (bench/results/h100/service_history.md), and
those machines run the same Python 1.5-1.8x slower than the dev box (bench/results/h100/session30/). This
times that Python where it can be rerun in seconds: a tiny Qwen3-shaped engine on the CPU with async
scheduling and the GPU's step structure (every decode step padded to its graph bucket, uncaptured, and
sampled inside the bucket's forward as a plain greedy step is there), `--requests` plain greedy requests of 20
prompt tokens all decoding. Every other piece is the engine's own code; the bucket's forward, the GPU's work,
is by default a stand-in that hands back a fixed random token for each row at once (`--forward model` runs
the tiny model on the CPU instead, timed apart and left out, but its ~30 ms of Python-heavy torch work a step
leaves the engine's objects out of the CPU's caches, where a GPU host's engine only waits between steps: on
the dev box `_process` took 0.49 ms a step that way against 0.25 with the stand-in,
bench/results/devbox/engine_host_step/).

Each figure is the median over `--repeats` blocks of `--steps` steps, in ms per step.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

STEM = "engine_host_step"
# (key, label): the pieces, in the order of a step; "of it" pieces lie inside the one before
PIECES = (
    ("host", "engine.step without the forward"),
    ("schedule", "schedule"),
    ("launch", "runner launch (without the forward)"),
    ("prepare", "of it, InputBatch.prepare"),
    ("collect", "read the last step (without _process)"),
    ("process", "_process: tokens to outputs"),
    ("record", "_record"),
    ("other", "the rest of engine.step"),
)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forward", choices=("stand-in", "model"), default="stand-in")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


def _timed(obj, name: str, label: str, totals: Counter) -> None:
    """Wraps obj.name so that its calls add their seconds to totals[label]."""
    inner = getattr(obj, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - start

    setattr(obj, name, wrapper)


def _stand_in_forward(graphs, vocab_size: int, max_rows: int) -> None:
    """graphs.run answers at once with a fixed random token for each row, as the greedy graph's [2, b] tokens."""
    import torch

    from engine.cuda_graphs import GraphOutputs

    generator = torch.Generator().manual_seed(0)
    tokens = torch.stack((torch.randint(256, vocab_size, (max_rows,), generator=generator),
                          torch.ones(max_rows, dtype=torch.int64)))  # fmt: skip
    hidden = torch.zeros((max_rows, 1))

    def run(bucket, greedy: bool = False) -> GraphOutputs:
        if not greedy or bucket[0] != bucket[1]:
            raise RuntimeError(f"the stand-in answers plain greedy decode steps only, got {bucket}")
        return GraphOutputs(hidden[: bucket[1]], None, tokens[:, : bucket[1]])

    graphs.run = run


def build(num_requests: int, forward: str = "stand-in"):
    """The engine with every piece timed, its requests all decoding, and the totals the timers add to."""
    import torch

    from bench.engine_common import model_dir
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    torch.set_num_threads(1)
    config = EngineConfig(
        model=ModelConfig(model=str(model_dir("Qwen3-0.6B", tiny=True)), dtype="float32", load_format="dummy",
                          max_model_len=2048),
        cache=CacheConfig(num_kv_tokens=num_requests * 2048),
        scheduler=SchedulerConfig(max_num_seqs=num_requests, max_num_batched_tokens=max(8192, num_requests)),
        device="cpu",
        async_scheduling=True,
    )  # fmt: skip
    engine = LLMEngine(config)
    engine.runner.enable_graphs(capture=False)  # the GPU's padded decode buckets, sampled inside the forward
    totals: Counter = Counter()
    if forward == "stand-in":
        _stand_in_forward(engine.runner.graphs, engine.vocab_size, num_requests)
    for obj, name, label in (
        (engine, "step", "step"),
        (engine.scheduler, "schedule", "schedule"),
        (engine.runner, "launch", "launch"),
        (engine.runner.graphs, "run", "forward"),
        (engine.runner.inputs, "prepare", "prepare"),
        (engine, "_collect", "collect"),
        (engine, "_process", "process"),
        (engine, "_record", "record"),
    ):
        _timed(obj, name, label, totals)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1900, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", [rng.randrange(engine.vocab_size) for _ in range(20)], params)
    graphs = engine.runner.graphs
    graphs.enabled = False  # the prefill step: the model, eagerly
    engine.step()
    graphs.enabled = True
    for _ in range(2):  # decode steps with a pending token each
        engine.step()
    if engine.scheduler.num_running != num_requests or engine.last_step.num_prefill_tokens:
        raise RuntimeError("the requests are not all decoding")
    return engine, totals


def per_step(totals: Counter, steps: int) -> dict:
    """ms per step of each piece, the forward taken out of the pieces that hold it."""
    ms = {k: v * 1e3 / steps for k, v in totals.items()}
    row = {
        "host": ms["step"] - ms["forward"],
        "schedule": ms["schedule"],
        "launch": ms["launch"] - ms["forward"],
        "prepare": ms["prepare"],
        "collect": ms["collect"] - ms["process"],
        "process": ms["process"],
        "record": ms["record"],
        "forward": ms["forward"],
    }
    row["other"] = row["host"] - row["schedule"] - row["launch"] - row["collect"] - row["process"] - row["record"]
    return row


def measure(num_requests: int, steps: int, repeats: int, forward: str = "stand-in") -> dict:
    engine, totals = build(num_requests, forward)
    rows = []
    for _ in range(repeats):
        totals.clear()
        for _ in range(steps):
            engine.step()
        if engine.last_step.num_prefill_tokens or len(engine.last_step.scheduled) != num_requests:
            raise RuntimeError("a timed step was not a full decode step")
        rows.append(per_step(totals, steps))
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def markdown(result: dict) -> str:
    from bench.report import table

    meta = result["meta"]
    rows = [{"piece": label, "ms": result["ms_per_step"][key]} for key, label in PIECES]
    return "\n".join([
        "# inferq engine host step (CPU)", "",
        f"{meta['date']} · python {meta['python']} · torch {meta['torch']} · {meta['cpu']} · "
        f"{result['requests']} plain greedy requests decoding, median of {result['repeats']} x {result['steps']} steps",
        "", table(rows, [("piece", "piece", ""), ("ms", "ms per step", ".3f")]), "",
        f"The bucket's forward ({result['forward']}, left out): {result['ms_per_step']['forward']:.3f} ms a step.", "",
    ])  # fmt: skip


def main(argv=None) -> dict:
    import torch

    from bench.engine_common import environment, write_results

    args = _parse_args(argv)
    result = {
        "meta": environment(torch.device("cpu")), "requests": args.requests, "steps": args.steps,
        "repeats": args.repeats, "forward": args.forward,
        "ms_per_step": measure(args.requests, args.steps, args.repeats, args.forward),
    }  # fmt: skip
    text = markdown(result)
    write_results(Path(args.out), STEM, result, text)
    print(text, flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
