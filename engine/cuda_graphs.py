"""CUDA graphs of the decode forward pass, one per batch-size bucket (vLLM style).

A decode step of n sequences runs the graph of the smallest bucket b >= n; rows n..b-1
are padding that writes no KV (slot -1) and reads none (seq_len 0). The graphs read their
inputs from the InputBatch's device buffers at the fixed offsets of `decode_views(b)`, so a
replay is: stage the batch, two copies, one launch. Sampling stays outside the graph.

Legend: b = bucket size (padded rows), n = real rows, H = hidden size.

Buckets: 1, 2, 4, 8, then every multiple of 8 up to the largest decode batch (and that
largest size itself), so padding wastes at most 7 rows (vLLM's choice).

NOTE: capture needs every kernel compiled and every library handle created first, so each
bucket runs once eagerly before its capture; all graphs share one memory pool and are
captured largest first so that smaller ones reuse the larger ones' blocks.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch

from engine.input_batch import InputBatch

logger = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    """The bucket sizes for decode batches of 1..max_batch rows, ascending."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch] + list(range(16, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    """The decode forward pass, padded to buckets, replayed from CUDA graphs.

    Args:
        forward: runs the model on (input_ids, positions, meta) and returns hidden states [b, H].
        inputs: the runner's InputBatch (static buffers).
        max_batch: the largest decode batch (min(max_num_seqs, max_num_batched_tokens)).
        capture: True records CUDA graphs (CUDA only). False runs the same padded forward
            eagerly over the same static buffers: the CPU tests' way to check bucketing and
            padding without a GPU.
    """

    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor],
        inputs: InputBatch,
        max_batch: int,
        capture: bool,
    ) -> None:
        if capture and inputs.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {inputs.device}")
        self.forward = forward
        self.inputs = inputs
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.capture = capture
        self.enabled = True  # benchmarks switch replay off to time the eager path of the same engine
        self.num_replays = 0
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._views = {b: inputs.decode_views(b) for b in self.sizes}

    def bucket_for(self, num_rows: int) -> int | None:
        """The smallest bucket holding num_rows rows, None when graphs are off or it is too large."""
        if not self.enabled or num_rows > self.max_batch:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, num_rows)]

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Warm-up and capture every bucket (CUDA), largest first; no-op without capture."""
        if not self.capture:
            return
        started = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        free_before = torch.cuda.mem_get_info(self.inputs.device)[0]
        for b in reversed(self.sizes):
            ids, positions, meta = self._views[b]
            self.inputs.fill_dummy_decode(b)
            self.forward(ids, positions, meta)  # compiles kernels, creates cuBLAS handles
            torch.cuda.synchronize(self.inputs.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._outputs[b] = self.forward(ids, positions, meta)
            self._graphs[b] = graph
        torch.cuda.synchronize(self.inputs.device)
        used = free_before - torch.cuda.mem_get_info(self.inputs.device)[0]
        logger.info(
            "captured %d decode CUDA graphs (batch %d..%d) in %.1fs, %.2f GiB",
            len(self.sizes), self.sizes[0], self.max_batch, time.monotonic() - started, used / 2**30,
        )  # fmt: skip

    def run(self, bucket: int) -> torch.Tensor:
        """Runs the padded decode forward of `bucket` rows over the staged inputs -> hidden [bucket, H].

        NOTE: the result is the graph's static output: read it before the next run.
        """
        self.num_replays += 1
        if self.capture:
            self._graphs[bucket].replay()
            return self._outputs[bucket]
        ids, positions, meta = self._views[bucket]
        return self.forward(ids, positions, meta)
