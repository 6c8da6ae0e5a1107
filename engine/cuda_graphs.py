"""CUDA graphs of the forward pass: one per decode batch-size bucket (vLLM style) and one
per token bucket of small mixed steps (prefill chunks with or without decodes).

Why mixed steps too: an eager forward launches ~10 kernels a layer from Python, and that host work
dwarfs the GPU work of a short prompt. A graph replays all of them with one launch, so a prompt's first
token no longer waits on Python. Up to 8,192 tokens (the default step budget): long prefills' GPU time
does not hide their launches for a small model either (decision 0008).

A step runs the graph of the smallest bucket that holds it; padding writes no KV (slot -1)
and reads none:
- decode (one new token per sequence), n rows -> bucket b >= n: rows n..b-1 get seq_len 0.
- mixed, T tokens of S sequences (T > S) -> bucket (T_b >= T, S_b = min(T_b - 1, max_num_seqs),
  which holds any S < T and keeps T_b != S_b, so the two kinds never share a key):
  tokens T..T_b-1 belong to no sequence, sequences S..S_b-1 have no new token (their
  query_start_loc entries equal T); the prefill kernel's grid, sized from (T_b, S_b),
  covers any real step of that size and skips the empty sequences.
The graphs read their inputs from the InputBatch's device buffers at the fixed offsets of
`decode_views` / `mixed_views`, so a replay is: stage the batch, one staging kernel, one launch.

Every bucket has a graph that ends in the greedy kernel (through the LM head): a step whose every
sampling row is plain greedy is one replay from the embedding to the [2, S_b] tokens, without the LM
head's and the greedy kernel's own launches from Python (decision 0021). A mixed bucket's greedy graph
gathers S_b rows of the hidden
states first (`InputBatch.mixed_sampling_rows`: the step's R sampling rows, then row 0 as padding),
so its tokens' first R rows are the requests'. Small decode buckets (up to HEAD_MAX_ROWS rows) also
have a graph that ends in the logits, in the model's dtype, for the sampler; larger decode buckets and
every mixed bucket have one that ends at the hidden states instead, and their greedy graphs keep no
logits (the [S_b, V] rows are a temporary of the graph's pool). Every other sampler takes the hidden
states (or the logits) and samples outside the graph.

enforce_eager takes the same buckets and padding without capture (StepGraphs(capture=False) on
CUDA): each bucket's forward runs once at start, so every kernel variant its steps take is built
then. Unpadded, decode attention's split count (a constexpr) follows the batch size and RMSNorm's
row tile its row count, so an eager engine would build kernel variants inside its first served steps
(decision 0009).

Legend: b = decode bucket, T_b / S_b = tokens / sequences of a mixed bucket, H = hidden size,
V = vocabulary.

Buckets: decode 1, 2, 4, 8, then every multiple of 8 up to the largest decode batch (and that
largest size itself), so padding wastes at most 7 rows (vLLM's choice); mixed 16, 32, 64,
96, 128, 192, 256, 384, 512 tokens, where a padded token costs little (the linear layers
still stream their weights), then steps of 128 to 1,024, of 256 to 2,048 and of 512 to
8,192, where padding is compute: at most a quarter of a bucket's tokens up to 2,048 and a
fifth beyond (an eighth from 4,096), against the eager launches' host time (decision 0008; and the
step's token budget where it is smaller). Steps over 8,192 tokens (a larger max_num_batched_tokens) run eagerly.

NOTE: capture needs every kernel compiled and every library handle created first, so each
bucket runs once eagerly before its capture; all graphs share one memory pool and are
captured largest first so that smaller ones reuse the larger ones' blocks. That reuse makes
a buffer first allocated *during* a capture unsafe to keep: it may sit where an earlier
graph keeps its temporaries, which that graph's replays overwrite. So the eager warm-ups
run on the capture stream itself: whatever a kernel allocates once per stream (the split
kernels' ticket counters, cuBLAS workspaces) exists before the first capture, outside the
pool. (Found on the GPU when mixed graphs were first captured ahead of the decode graphs:
the decode kernel's counters landed in a mixed graph's temporaries, and decodes after a
mixed step read garbage.)
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.input_batch import InputBatch

logger = logging.getLogger(__name__)

MIXED_TOKEN_SIZES = (
    (16, 32, 64, 96, 128, 192, 256, 384, 512)
    + tuple(range(640, 1025, 128))
    + tuple(range(1280, 2049, 256))
    + tuple(range(2560, 8193, 512))
)
MAX_MIXED_GRAPH_TOKENS = MIXED_TOKEN_SIZES[-1]

Bucket = tuple[int, int]  # (tokens, sequences) after padding; equal for a decode bucket
# Decode buckets up to this many rows keep the LM head's logits as a graph output (for the sampler, which
# then skips the head's launch). Where it pays is batch-1 latency: a launch gap is a few microseconds of a
# ~1 ms step. The cap keeps the logits the graph pool holds small ([8, V] in 16 bits: 2.4 MB at V = 152k).
# Every bucket, mixed ones too, has the greedy graph (head and greedy kernel inside): at full-batch steps
# launching the two outside the graph cost more host time than the runner's whole work after the replay
# (decision 0021).
HEAD_MAX_ROWS = 8


@dataclass
class GraphOutputs:
    """What a bucket's replay leaves in its static buffers (read them before the next replay).

    hidden: [T_b, H] hidden states after the final norm.
    logits: [b, V] the LM head's output in the model's dtype, where a small bucket's graph ran the head.
    tokens: [2, S_b] int64 (greedy token, 1 where the row's logits were all finite), where the replay
        ran the greedy graph; rows 0..R-1 are the step's sampling rows.
    """

    hidden: torch.Tensor
    logits: torch.Tensor | None = None
    tokens: torch.Tensor | None = None


def capture_sizes(max_batch: int) -> list[int]:
    """The bucket sizes for decode batches of 1..max_batch rows, ascending."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch] + list(range(16, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def mixed_capture_sizes(max_tokens: int) -> list[int]:
    """The token buckets of mixed steps of 2..max_tokens tokens (capped at MAX_MIXED_GRAPH_TOKENS)."""
    if max_tokens < 2:
        return []
    sizes = [s for s in MIXED_TOKEN_SIZES if s <= max_tokens]
    if max_tokens < MAX_MIXED_GRAPH_TOKENS and (not sizes or sizes[-1] != max_tokens):
        sizes.append(max_tokens)
    return sizes


class StepGraphs:
    """The forward pass of decode steps and small mixed steps, padded to buckets, replayed from CUDA graphs.

    Args:
        forward: runs the model on (input_ids, positions, meta) and returns hidden states [T_b, H].
        inputs: the runner's InputBatch (static buffers).
        max_batch: the largest decode batch (min(max_num_seqs, max_num_batched_tokens)).
        max_mixed_tokens: the largest mixed step to graph (the step's token budget; 0 for none).
        capture: True records CUDA graphs (CUDA only). False runs the same padded forward
            eagerly over the same static buffers: an enforce_eager engine's steps on CUDA (see
            `build`), and the CPU tests' way to check bucketing and padding without a GPU.
        head: hidden [b, H] -> logits [b, V] in the model's dtype; None keeps every graph at the
            hidden states.
        greedy: logits [b, V] -> [2, b] int64 (token, finite); None leaves greedy outside the graphs.
        head_max_rows: the largest decode bucket with a graph that ends in `head`'s logits (HEAD_MAX_ROWS).
    """

    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor],
        inputs: InputBatch,
        max_batch: int,
        max_mixed_tokens: int,
        capture: bool,
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
        greedy: Callable[[torch.Tensor], torch.Tensor] | None = None,
        head_max_rows: int = HEAD_MAX_ROWS,
    ) -> None:
        if greedy is not None and head is None:
            raise ValueError("a greedy graph needs the head's logits: pass head too")
        if capture and inputs.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {inputs.device}")
        self.forward = forward
        self.head = head
        self.greedy = greedy
        self.inputs = inputs
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        # NOTE: the warm-up batch of a mixed bucket spreads T_b tokens over S_b sequences; a
        # bucket whose sequences would not fit the block table is left out (a real step of
        # that size cannot fit it either).
        longest = inputs.width * inputs.block_size
        self.mixed_sizes = [t for t in mixed_capture_sizes(max_mixed_tokens) if -(-t // self._mixed_seqs(t)) <= longest]
        self.capture = capture
        self.enabled = True  # benchmarks switch replay off to time the eager path of the same engine
        self.num_replays = 0
        self.num_mixed_replays = 0
        self.num_logits_replays = 0  # replays that ran the LM head (the logits graphs, and the greedy ones after it)
        self.num_token_replays = 0  # ... and in the greedy kernel
        self.head_sizes = [b for b in self.sizes if b <= head_max_rows] if head is not None else []
        self._graphs: dict[tuple[Bucket, str], torch.cuda.CUDAGraph] = {}
        self._outputs: dict[tuple[Bucket, str], GraphOutputs] = {}
        self._views = {(b, b): inputs.decode_views(b) for b in self.sizes}
        self._mixed_rows: dict[Bucket, torch.Tensor] = {}  # the rows a mixed bucket's greedy graph samples
        for t in self.mixed_sizes:
            bucket = (t, self._mixed_seqs(t))
            self._views[bucket] = inputs.mixed_views(*bucket)
            self._mixed_rows[bucket] = inputs.mixed_sampling_rows(*bucket)
        self._bucket_ends = {bucket: self._ends(bucket) for bucket in self._views}  # fixed at start; read every step

    def _mixed_seqs(self, num_tokens: int) -> int:
        return min(num_tokens - 1, self.inputs.max_num_seqs)

    def bucket_for(self, num_tokens: int, num_seqs: int) -> Bucket | None:
        """The smallest bucket holding a step of num_tokens new tokens over num_seqs sequences;
        None when graphs are off or the step is too large."""
        if not self.enabled or num_seqs < 1:
            return None
        if num_tokens == num_seqs:
            if num_seqs > self.max_batch:
                return None
            b = self.sizes[bisect.bisect_left(self.sizes, num_seqs)]
            return (b, b)
        if not self.mixed_sizes or num_tokens > self.mixed_sizes[-1]:
            return None
        t = self.mixed_sizes[bisect.bisect_left(self.mixed_sizes, num_tokens)]
        return (t, self._mixed_seqs(t))

    def _is_small_decode(self, bucket: Bucket) -> bool:
        return bucket[0] == bucket[1] and bucket[1] in self.head_sizes

    def _ends(self, bucket: Bucket) -> tuple[str, ...]:
        """Where the bucket's graphs stop: 'logits' (small decode buckets) or 'hidden', then (with a greedy
        callable) 'tokens'."""
        if self.head is None:
            return ("hidden",)
        first = "logits" if self._is_small_decode(bucket) else "hidden"
        return (first, "tokens") if self.greedy is not None else (first,)

    def _body(self, bucket: Bucket, end: str) -> GraphOutputs:
        """The work a graph of `bucket` ending at `end` records (or, without capture, runs)."""
        ids, positions, meta = self._views[bucket]
        hidden = self.forward(ids, positions, meta)
        if end == "hidden":
            return GraphOutputs(hidden)
        rows = self._mixed_rows.get(bucket)  # a decode bucket samples every row as it is
        logits = self.head(hidden if rows is None else hidden.index_select(0, rows))
        tokens = self.greedy(logits) if end == "tokens" else None
        if not self._is_small_decode(bucket):
            # NOTE: dropped here so that a large bucket's [S_b, V] logits go back to the pool when its capture ends
            # (a temporary of this graph, which later captures may reuse): only small decode buckets keep them
            logits = None
        return GraphOutputs(hidden, logits, tokens)

    @torch.inference_mode()
    def build(self) -> None:
        """Runs every bucket's forward once, largest first, and captures its graphs where `capture` (CUDA; a
        no-op on CPU). Without capture the runs alone matter: they build every kernel variant a padded step
        takes (an enforce_eager engine's start, so that its served steps build none)."""
        device = self.inputs.device
        if device.type != "cuda":
            return
        started = time.monotonic()
        pool = torch.cuda.graph_pool_handle() if self.capture else None
        # Without capture the runs stay on the steps' own stream, whose cache then holds their blocks.
        stream = torch.cuda.Stream(device) if self.capture else torch.cuda.current_stream(device)
        free_before = torch.cuda.mem_get_info(device)[0]
        for bucket in sorted(self._views, reverse=True):
            num_tokens, num_seqs = bucket
            if num_tokens == num_seqs:
                self.inputs.fill_dummy_decode(num_seqs)
            else:
                self.inputs.fill_dummy_mixed(num_tokens, num_seqs)
            ends = self._bucket_ends[bucket]
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                # the longest body (its last end) runs every kernel the bucket's graphs hold: compiles them,
                # makes per-stream buffers and handles
                self._body(bucket, ends[-1])
            torch.cuda.synchronize(device)
            if not self.capture:
                continue
            for end in ends:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    self._outputs[(bucket, end)] = self._body(bucket, end)
                self._graphs[(bucket, end)] = graph
        torch.cuda.synchronize(device)
        used = free_before - torch.cuda.mem_get_info(device)[0]
        logger.info(
            "%s decode batch %d..%d and mixed steps of %s tokens in %.1fs, %.2f GiB",
            f"captured {len(self._graphs)} CUDA graphs of" if self.capture else "ran the eager steps (no capture) of",
            self.sizes[0], self.max_batch, self.mixed_sizes or "no", time.monotonic() - started, used / 2**30,
        )  # fmt: skip

    def run(self, bucket: Bucket, greedy: bool = False) -> GraphOutputs:
        """Runs the padded forward of `bucket` over the staged inputs, with the LM head where the
        bucket's graphs end in it, and the greedy kernel too when `greedy` (the caller's word that
        every sampling row samples plainly greedy, and for a decode bucket that its rows are the
        step's first S) and the bucket has that graph.

        NOTE: the outputs are the graph's static buffers: read them before the next run.
        """
        ends = self._bucket_ends[bucket]
        end = "tokens" if greedy and "tokens" in ends else ends[0]
        self.num_replays += 1
        self.num_mixed_replays += bucket[0] != bucket[1]
        self.num_logits_replays += end != "hidden"
        self.num_token_replays += end == "tokens"
        if self.capture:
            self._graphs[(bucket, end)].replay()
            return self._outputs[(bucket, end)]
        return self._body(bucket, end)
