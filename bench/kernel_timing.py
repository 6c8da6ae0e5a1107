"""Timing for the kernel benchmarks, and the ceilings measured in the same run.

On the GPU every figure is triton.testing.do_bench's median over repeated calls
(CUDA events, after warm-up; do_bench also flushes the L2 before each call), and
inputs rotate through copies that together exceed twice the L2, so no call finds
its operands cached. In a dry run (CPU, Triton interpreter) each case is called
once and timed with the wall clock: the figures mean nothing, the code paths and
the arithmetic are what a dry run checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bench.kernel_math import rotations

MIN_GRAPH_CALLS = 16


@dataclass(frozen=True)
class Bench:
    """Where and how the suites run.

    Args:
        device: cuda, or cpu for a dry run.
        dry_run: call each case once (no do_bench, no torch.compile, SDPA math backend).
        l2_bytes: the GPU's L2 size (input rotation is sized from it).
    """

    device: torch.device
    dry_run: bool
    l2_bytes: int

    @classmethod
    def on(cls, device: torch.device, dry_run: bool) -> Bench:
        """A Bench on `device`, with its L2 size read from the device (0 on the CPU)."""
        l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
        return cls(device=device, dry_run=dry_run, l2_bytes=l2)

    @classmethod
    def for_run(cls, dry_run: bool) -> Bench:
        """The Bench of a kernel benchmark's run: on the CPU interpreter for --dry-run (its code paths only),
        else on the CUDA GPU (refused without one)."""
        if dry_run:
            from kernels.interpreter import use_cpu_interpreter

            use_cpu_interpreter()
        elif not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU: run with --dry-run for the code paths")
        return cls.on(torch.device("cpu" if dry_run else "cuda"), dry_run)

    def rotations(self, bytes_per_call: int) -> int:
        return 1 if self.dry_run else rotations(bytes_per_call, self.l2_bytes)

    def measure(self, call: Callable, inputs: Sequence[tuple], graph: bool) -> tuple[float, str]:
        """(milliseconds per call, timing method): in a CUDA graph where asked and capturable, else on the stream.

        A CUDA graph holds one call per input copy and is replayed as a whole, so the
        figure is GPU time without the Python launch overhead (how the engine runs
        decode); calls that cannot be captured (a host sync) fall back to the stream.
        """
        if graph and not self.dry_run:
            try:
                return self._graph_ms(call, inputs), "cuda_graph"
            except RuntimeError:
                torch.cuda.synchronize()
        return self.time_ms(call, inputs), "stream"

    def _graph_ms(self, call: Callable, inputs: Sequence[tuple]) -> float:
        import triton.testing

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
            for args in inputs:
                call(*args)
        torch.cuda.current_stream().wait_stream(side)
        # NOTE: at least MIN_GRAPH_CALLS calls per graph (cycling through the copies): a graph of
        # one large call (a 268 MB decode needs no second copy to defeat the L2) also timed the
        # graph's own launch, ~10 us over the kernel's 101 us in Nsight Compute.
        calls = [inputs[i % len(inputs)] for i in range(max(len(inputs), MIN_GRAPH_CALLS))]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):  # the stream the warm-up made per-stream buffers on
            for args in calls:
                call(*args)
        ms = triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
        del graph
        return float(ms) / len(calls)

    def time_ms(self, call: Callable, inputs: Sequence[tuple]) -> float:
        """Median milliseconds of call(*inputs[i]) on the stream, i cycling through the input copies.

        NOTE: CUDA events around one call also count the Python launch time whenever the
        GPU runs out of queued work, so tiny calls read as their launch overhead.
        """
        calls = 0

        def step():
            nonlocal calls
            args = inputs[calls % len(inputs)]
            calls += 1
            return call(*args)

        if self.dry_run:
            start = time.perf_counter()
            step()
            return (time.perf_counter() - start) * 1e3
        import triton.testing

        return float(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def measure_ceilings(bench: Bench) -> dict:
    """Device-to-device copy (bytes read + written), a large reduction (bytes read) and a bf16 matmul."""
    numel = 2**16 if bench.dry_run else 2**30  # 2 GiB of bf16 on the GPU
    src = torch.randn(numel, device=bench.device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = bench.time_ms(torch.Tensor.copy_, [(dst, src)])
    read_ms = bench.time_ms(lambda x: x.sum(dtype=torch.float32), [(src,)])
    nbytes = src.numel() * src.element_size()
    del src, dst
    n = 256 if bench.dry_run else 8192
    dtype = torch.float32 if bench.dry_run else torch.bfloat16  # the CPU has no fast bf16 matmul to check
    a = torch.randn(n, n, device=bench.device).to(dtype)
    b = torch.randn(n, n, device=bench.device).to(dtype)
    matmul_ms = bench.time_ms(torch.matmul, [(a, b)])
    del a, b
    bench.free()
    return {
        "copy_gbps": 2 * nbytes / copy_ms / 1e6,
        "read_gbps": nbytes / read_ms / 1e6,
        "matmul_tflops": 2 * n**3 / matmul_ms / 1e9,
        "copy_bytes": 2 * nbytes,
        "matmul_n": n,
    }


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def tflops(flops: float, ms: float) -> float:
    return flops / ms / 1e9
