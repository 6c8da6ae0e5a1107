"""What the stream ops around a decode step's graph cost on the GPU, apart from their own work:
`python -m bench.stream_transition_trials --out DIR` (GPU).

Why: the Llama-3.2-1B batch-1 step is busy ~1019 us of a ~1038 us wall clock (session 22), and the
graphed step's timeline shows its idle time at the step's edges: before the two staging copies (HtoD),
before the pending-token gather and before the tokens' copy back (DtoH). Each of those is a copy-engine
op or a lone kernel outside the graph. This times the same sequence around a fixed stand-in for the
forward pass (a graph of one spinning kernel) with the queue kept full, as async scheduling keeps it
(two steps in flight, the host waiting for the older one's tokens only), in the variants:

    graph_only    the stand-in graph back to back (the floor)
    engine        two HtoD copies, a gather, the graph, an argmax kernel, a DtoH copy (the engine today)
    one_copy      the same with one HtoD copy
    in_graph      the copies, gather, argmax and DtoH captured in the graph (memcpy nodes)
    zero_copy     one graph: a kernel reads the staged batch from pinned host memory and another writes
                  the tokens into pinned host memory (no copy engine), the gather and argmax in between

Per variant: us a step over the floor (the mean over STEPS steps, three repeats, median).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

STEPS = 400
ROWS = 64  # int64 words staged a step (ids, positions, slots, rows of a small decode batch)
SPIN_CYCLES = 1_500_000  # ~0.8 ms at the H100's clocks: the stand-in forward pass


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """dst[:n] = src[:n]; src may be pinned host memory (read over PCIe, no copy engine)."""
    idx = tl.arange(0, BLOCK)
    tl.store(dst_ptr + idx, tl.load(src_ptr + idx, mask=idx < n), mask=idx < n)


def _step_ops(variant: str, host_in, host_out, dev_in, dev_in2, tokens, spin_graph):
    """The ops of one step after the host staged host_in, as in the engine (or the trial's form)."""
    if variant in ("engine", "one_copy"):
        dev_in.copy_(host_in, non_blocking=True)
        if variant == "engine":
            dev_in2.copy_(host_in[:16], non_blocking=True)
        torch.index_select(tokens, 0, dev_in[:1], out=dev_in[8:9])
        spin_graph.replay()
        torch.argmax(dev_in[:ROWS].float(), dim=0, keepdim=True, out=tokens[:1])
        host_out.copy_(tokens, non_blocking=True)


def _capture(variant: str, host_in, host_out, dev_in, dev_in2, tokens) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def body():
        if variant == "graph_only":
            torch.cuda._sleep(SPIN_CYCLES)
            return
        if variant == "in_graph":
            dev_in.copy_(host_in, non_blocking=True)
            dev_in2.copy_(host_in[:16], non_blocking=True)
        else:  # zero_copy
            _copy_kernel[(1,)](host_in, dev_in, ROWS, BLOCK=ROWS)
        torch.index_select(tokens, 0, dev_in[:1], out=dev_in[8:9])
        torch.cuda._sleep(SPIN_CYCLES)
        torch.argmax(dev_in[:ROWS].float(), dim=0, keepdim=True, out=tokens[:1])
        if variant == "in_graph":
            host_out.copy_(tokens, non_blocking=True)
        else:
            _copy_kernel[(1,)](tokens, host_out, tokens.numel(), BLOCK=16)

    with torch.cuda.stream(stream):
        body()  # warm-up: compiles the Triton kernel outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        body()
    torch.cuda.synchronize()
    return graph


def time_variant(variant: str) -> float:
    """Mean us a step with two steps in flight (the host waits on the step before the last)."""
    host_in = torch.arange(ROWS, dtype=torch.int64).pin_memory()
    host_out = [torch.zeros(4, dtype=torch.int64).pin_memory() for _ in range(2)]
    dev_in = torch.zeros(ROWS, dtype=torch.int64, device="cuda")
    dev_in2 = torch.zeros(16, dtype=torch.int64, device="cuda")
    tokens = torch.zeros(4, dtype=torch.int64, device="cuda")
    spin = torch.cuda.CUDAGraph()
    with torch.cuda.graph(spin):
        torch.cuda._sleep(SPIN_CYCLES)
    graphs = None
    if variant in ("graph_only", "in_graph", "zero_copy"):
        graphs = [_capture(variant, host_in, host_out[i], dev_in, dev_in2, tokens) for i in range(2)]
    events = [torch.cuda.Event(), torch.cuda.Event()]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for step in range(STEPS):
        slot = step % 2
        if step >= 2:
            events[slot].synchronize()  # the tokens of two steps ago, as the engine reads them
            host_out[slot].tolist()
        host_in[0] = step % 3  # the host stages the next batch
        if graphs is not None:
            graphs[slot].replay()
        else:
            _step_ops(variant, host_in, host_out[slot], dev_in, dev_in2, tokens, spin)
        events[slot].record()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    variants = ("graph_only", "engine", "one_copy", "in_graph", "zero_copy")
    results = {}
    for variant in variants:
        try:
            runs = sorted(time_variant(variant) for _ in range(3))
            results[variant] = {"us_per_step": runs[1], "runs": runs}
        except Exception as exc:  # a variant the driver or Triton refuses: say so, time the rest
            results[variant] = {"error": f"{type(exc).__name__}: {exc}"}
    floor = results["graph_only"]["us_per_step"]
    title = f"# Stream ops around a step's graph ({torch.cuda.get_device_name()}, torch {torch.__version__}, "
    title += f"triton {triton.__version__})"
    lines = [title, "", "| variant | us a step | over the graph alone |", "|---|---|---|"]
    for variant, r in results.items():
        if "error" in r:
            lines.append(f"| {variant} | {r['error']} | - |")
        else:
            lines.append(f"| {variant} | {r['us_per_step']:.1f} | {r['us_per_step'] - floor:.1f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stream_transition_trials.json").write_text(json.dumps(results, indent=1))
    (out / "stream_transition_trials.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
