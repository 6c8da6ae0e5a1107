"""Where the engine chooses, per call, a Triton kernel or its torch reference: every kernel the engine
launches is called through a function here or in one of the dispatch modules that share this one's setting:
engine/attention_ops.py (the KV store and paged attention), engine/moe_ops.py (the router and the routed
experts) and engine/quant_ops.py (the quantized matmuls). This module holds the setting and the ops of the
dense layers (norms, activations, projections and their fused one-token paths), the step's staging and sampling.

Model layers, the runner and the sampler call these functions. Elsewhere the engine imports from kernels/
only helpers that launch nothing: the PDL switch (engine/llm_engine.py, engine/parallel/follower.py), the
pinned buffers the staging kernel reads (engine/input_batch.py), the packing of sampling parameters
(engine/sampler.py), the masked finiteness rule in torch (engine/torch_sampling.py), the quantized weights'
layout constants and int4 packing (engine/quantization/) and the CPU interpreter's setup for a
tensor-parallel rank whose rank 0 runs it (engine/parallel/follower.py); tests/engine/test_kernel_imports.py
holds the engine to that. The choice is made per call from the
tensor's device and one process-wide setting (`set_kernel_backend`, fed from
`EngineConfig.kernels` by the ModelRunner):

- "auto": Triton kernels on CUDA, torch references elsewhere (the default);
- "torch": always the references (the parity baseline on any device);
- "triton": always the kernels (on CPU only under TRITON_INTERPRET=1, for tests).

NOTE: the setting is process-wide on purpose: one engine owns the process (one
worker per GPU), and layers stay free of plumbing. Tests switch it with
`kernel_backend(...)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from engine.torch_sampling import random_sample_torch
from kernels._pdl import use_pdl
from kernels.gelu_tanh import gelu_tanh_ref
from kernels.gelu_tanh_and_mul import gelu_tanh_and_mul_ref
from kernels.greedy_sample import greedy_sample_ref
from kernels.layer_norm import layer_norm_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.silu_and_mul import silu_and_mul_ref
from kernels.stage_batch import StagingBuffers, stage_batch_ref
from kernels.token_bitmask import apply_token_bitmask_ref

_BACKENDS = ("auto", "torch", "triton")
_backend = "auto"


def set_kernel_backend(name: str) -> None:
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"kernel backend must be one of {_BACKENDS}, got {name!r}")
    _backend = name


def get_kernel_backend() -> str:
    return _backend


@contextlib.contextmanager
def kernel_backend(name: str) -> Iterator[None]:
    previous = _backend
    set_kernel_backend(name)
    try:
        yield
    finally:
        set_kernel_backend(previous)


def use_triton(x: torch.Tensor) -> bool:
    if _backend == "torch":
        return False
    if _backend == "triton":
        return True
    return x.is_cuda


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        from kernels.rms_norm import rms_norm as kernel

        return kernel(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    if use_triton(x):
        from kernels.rms_norm import fused_add_rms_norm as kernel

        return kernel(x, residual, weight, eps)
    return fused_add_rms_norm_ref(x, residual, weight, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        from kernels.layer_norm import layer_norm as kernel

        return kernel(x, weight, bias, eps)
    return layer_norm_ref(x, weight, bias, eps)


# The one-token dispatch, each threshold from engine A/Bs of batch-1 decode (decisions 0014 and 0016; see
# linear and rms_norm_linear). Module-level so that a benchmark can move them (bench/decode_latency.py flags).
GEMV_MIN_FEATURES = 4096  # projections with both dims at least this: kernels/gemv.py
# ... and this where the kernels launch with PDL (kernels/_pdl.py): the small models' projections (Llama-3.2-1B's
# o and down, the Qwen3-0.6B, Qwen2.5-0.5B and SmolLM2-135M shapes, whose smallest dims are 1024, 896 and 576)
# then chain with the kernels around them instead of breaking the chain as cuBLAS kernels do.
GEMV_MIN_FEATURES_PDL = 512
NORM_GEMV_MIN_FEATURES = 2048  # a pre-norm and the projection after it: kernels/rms_norm_gemv.py
NORM_GEMV_MIN_FEATURES_PDL = 512  # ... where the kernels launch with PDL (measured with the line above)
SWIGLU_GEMV_MAX_FEATURES = 2048  # and SwiGLU inside it too where the hidden size K is at most this
# The pre-norm, qkv projection, RoPE and KV store as one kernel at one token (kernels/rms_norm_qkv_rope.py,
# decision 0017); bench/decode_latency.py --fused-qkv-rope on|off for an A/B.
QKV_ROPE_FUSION = True
# bf16/fp16 projections of 2..DENSE_STREAMING_MAX_TOKENS tokens through kernels/quant_matmul.py's dense streaming
# GEMM (each weight byte read once for every token) instead of cuBLAS; 0: off until an engine A/B on a GPU shows
# where it wins (bench/quantized_decode.py's "bf16-streaming" entry measures it).
DENSE_STREAMING_MAX_TOKENS = 0


# 2..GEMV_ROWS_MAX token rows (a few sequences decoding) through the few-rows kernels (kernels/gemv_rows.py: the
# one-token kernels' norm and SwiGLU fusion and PDL chain) where the weight holds at most GEMV_ROWS_MAX_WEIGHTS
# elements and fewer than GEMV_ROWS_MAX_OUT rows: the small models' launch-bound projections. Measured on an H200
# on 2026-11-29 (bench/gemv_rows.py, decision 0071): a large weight's stream (an LM head's vocabulary rows: one
# large read a step even in a small model) ran slower on these kernels than on cuBLAS; at 8 rows the norm-fused
# gate|up did too, and 8 requests decoding, or a verification step's 5 decode rows padded to 8, gained nothing.
GEMV_ROWS_MAX = 4
GEMV_ROWS_MAX_WEIGHTS = 2_000_000  # SmolLM2-135M's largest (gate|up: 1.77M) in, Llama-3.2-1B's o (4.19M) out
GEMV_ROWS_MAX_OUT = 32768


def uses_gemv_rows(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the few-rows kernels take x @ weight^T: 2..GEMV_ROWS_MAX tokens on the Triton backend, a weight of
    at most GEMV_ROWS_MAX_WEIGHTS elements and fewer than GEMV_ROWS_MAX_OUT rows."""
    if x.dim() != 2 or not 2 <= x.shape[0] <= GEMV_ROWS_MAX or not use_triton(x):
        return False
    return weight.numel() <= GEMV_ROWS_MAX_WEIGHTS and weight.shape[0] < GEMV_ROWS_MAX_OUT


def gemv_min_features(device: torch.device) -> int:
    """The least weight dims that take kernels/gemv.py at one token on `device`."""
    return GEMV_MIN_FEATURES_PDL if use_pdl(device) else GEMV_MIN_FEATURES


def norm_gemv_min_features(device: torch.device) -> int:
    """The least weight dims whose pre-norm runs inside the projection at one token on `device`."""
    return NORM_GEMV_MIN_FEATURES_PDL if use_pdl(device) else NORM_GEMV_MIN_FEATURES


def uses_gemv(x: torch.Tensor, weight: torch.Tensor, min_features: int | None = None) -> bool:
    """Whether a one-token kernel takes x @ weight^T: one token, on the Triton backend, and a weight
    of at least min_features (default gemv_min_features) in each dim."""
    if x.dim() != 2 or x.shape[0] != 1 or not use_triton(x):  # the cheap tests first: this runs per projection
        return False
    return min(weight.shape) >= (gemv_min_features(x.device) if min_features is None else min_features)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    gemv_min_features: int | None = None,
) -> torch.Tensor:
    """[T, K] -> [T, N]: F.linear (cuBLAS), or kernels/gemv.py for one token and a large weight, or
    kernels/gemv_rows.py for a few tokens and a small weight (uses_gemv_rows). out_dtype
    (default x's): the result rounded to x's dtype and stored as this one; the kernel stores it so itself,
    with no cast kernel after it (the LM head's fp32 logits: one kernel fewer at batch-1 decode).
    gemv_min_features: the smallest weight dim that takes the kernel at one token (default
    gemv_min_features(device); an MoE router's gate, E rows, sets its own).

    NOTE: dispatch by measurement (decision 0014): without PDL the small shapes (K = 2048, or N = 2048)
    made the step slower on the kernel although each alone was as fast: short programs (4 tiles of K at
    K = 2048) start up between back-to-back kernels. With programmatic dependent launch (kernels/_pdl.py)
    that start-up overlaps the kernel before, and the same shapes gain: hence gemv_min_features.
    """
    if uses_gemv(x, weight, gemv_min_features):
        from kernels.gemv import gemv

        return gemv(x, weight, bias, out_dtype=out_dtype)
    # the streaming GEMM first: it is off unless an A/B switches it on for every 2..N-token projection
    if 2 <= x.shape[0] <= DENSE_STREAMING_MAX_TOKENS and out_dtype is None and x.dim() == 2 and use_triton(x):
        from kernels.quant_matmul import dense_matmul

        y = dense_matmul(x, weight)
        return y if bias is None else y + bias
    if uses_gemv_rows(x, weight):
        from kernels.gemv_rows import gemv_rows

        return gemv_rows(x, weight, bias, out_dtype=out_dtype)
    y = F.linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)


def rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    swiglu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm and the projection after it: (linear(rms_norm(x + residual)), x + residual) [T, K]
    -> ([T, N], [T, K]); with swiglu the projection is gate|up and its output silu(gate) * up [T, N/2].
    Without a residual the norm reads x alone and x is the residual returned.

    NOTE: at one token and a weight of at least norm_gemv_min_features the norm and the residual
    add run inside the projection (kernels/rms_norm_gemv.py), and the SwiGLU too up to a hidden size
    of SWIGLU_GEMV_MAX_FEATURES: two or three kernels a decoder layer fewer at batch-1 decode. At
    2..GEMV_ROWS_MAX tokens and a small weight (uses_gemv_rows) kernels/gemv_rows.py fuses them the same
    way. Elsewhere these are the separate kernels (or references) of the unfused layer. Above a hidden size
    of SWIGLU_GEMV_MAX_FEATURES the SwiGLU stays its own kernel: there the two row sets' weight stream runs
    slower than the plain projection's by more than the SiLU-and-mul kernel it saves (decision 0016).
    """
    if uses_gemv(x, weight, norm_gemv_min_features(x.device)):
        from kernels.rms_norm_gemv import rms_norm_gemv

        if not swiglu or x.shape[1] <= SWIGLU_GEMV_MAX_FEATURES:
            return rms_norm_gemv(x, residual, norm_weight, eps, weight, bias, swiglu=swiglu)
        y, residual = rms_norm_gemv(x, residual, norm_weight, eps, weight, bias)
        return silu_and_mul(y), residual
    if uses_gemv_rows(x, weight):
        from kernels.gemv_rows import rms_norm_gemv_rows

        if not swiglu or x.shape[1] <= SWIGLU_GEMV_MAX_FEATURES:
            return rms_norm_gemv_rows(x, residual, norm_weight, eps, weight, bias, swiglu=swiglu)
        y, residual = rms_norm_gemv_rows(x, residual, norm_weight, eps, weight, bias)
        return silu_and_mul(y), residual
    if residual is None:
        normed, residual = rms_norm(x, norm_weight, eps), x
    else:
        normed, residual = fused_add_rms_norm(x, residual, norm_weight, eps)
    y = linear(normed, weight, bias)
    return (silu_and_mul(y) if swiglu else y), residual


def fuses_qkv_rope(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a layer's pre-norm, qkv projection, RoPE and KV store run as one kernel (rms_norm_qkv_rope):
    QKV_ROPE_FUSION on, and where the norm would run inside the projection (one token, a large weight)."""
    return QKV_ROPE_FUSION and uses_gemv(x, weight, norm_gemv_min_features(x.device))


def rms_norm_qkv_rope(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's (qkv [1, N] with q rotated, x + residual), rope(k) and v stored into kv_cache
    [2, N_blocks, B, Hkv, D] at slot_mapping, as one kernel. Only where fuses_qkv_rope says so: elsewhere
    the layer runs rms_norm_linear and its attention's rope_store_kv."""
    from kernels.rms_norm_qkv_rope import rms_norm_qkv_rope as kernel

    return kernel(x, residual, norm_weight, eps, weight, bias, positions, cos_sin_cache, kv_cache[0], kv_cache[1],
                  slot_mapping, num_q_heads)  # fmt: skip


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from kernels.silu_and_mul import silu_and_mul as kernel

        return kernel(x)
    return silu_and_mul_ref(x)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] gate | up -> gelu_tanh(gate) * up [T, I] (GeGLU: Gemma's MLP)."""
    if use_triton(x):
        from kernels.gelu_tanh_and_mul import gelu_tanh_and_mul as kernel

        return kernel(x)
    return gelu_tanh_and_mul_ref(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from kernels.gelu_tanh import gelu_tanh as kernel

        return kernel(x)
    return gelu_tanh_ref(x)


def stage_batch(
    buffers: StagingBuffers, n64: int, num_ids: int, pending: torch.Tensor | None, n32: int, num_rows: int, width: int
) -> None:
    """A step's staged batch from the host buffers into the device's (kernels/stage_batch.py): the int64
    and int32 heads, pending input ids (staged as -1 - row) from `pending`, changed block-table rows."""
    if use_triton(buffers.dev64):
        from kernels.stage_batch import stage_batch as kernel

        kernel(buffers, n64, num_ids, pending, n32, num_rows, width)
        return
    stage_batch_ref(buffers, n64, num_ids, pending, n32, num_rows, width)


def write_to_host(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst (a pinned host buffer) = src (int64 on the device), by a kernel on CUDA (kernels/write_to_host.py)."""
    if use_triton(src):
        from kernels.write_to_host import write_to_host as kernel

        kernel(src, dst)
        return
    dst.copy_(src, non_blocking=True)


def greedy_sample(logits: torch.Tensor, masked: bool = False) -> torch.Tensor:
    """[S, V] logits -> [2, S] int64: (argmax per row, 1 if the row is all finite else 0). masked: a grammar's
    bitmask went over the logits, so -inf is a forbidden token, not a fault (kernels/greedy_sample.py)."""
    if use_triton(logits):
        from kernels.greedy_sample import greedy_sample as kernel

        return kernel(logits, masked=masked)
    return greedy_sample_ref(logits, masked)


def random_sample(
    logits: torch.Tensor, params: torch.Tensor, rows_ask_step_0: bool = False, masked: bool = False
) -> torch.Tensor:
    """[S, V] logits, [5, S] float64 params on the host (kernels.random_sample.pack_params; pinned
    for CUDA) -> [2, S] int64 on logits' device: (token per row, 1 if the row is all finite else 0).
    rows_ask_step_0: some row has kernels.random_sample.asks_step_0 (the caller knows from its lists).
    masked: as greedy_sample's."""
    if use_triton(logits):
        from kernels.random_sample import random_sample as kernel
        from kernels.random_sample import wants_step_0

        step_0 = wants_step_0(rows_ask_step_0, logits.shape[0], logits.shape[1], logits.device)
        return kernel(logits, params.to(logits.device, non_blocking=True), masked=masked, select_top_k=step_0)
    return random_sample_torch(logits, params, masked)  # reads params on the host, where they already are


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """logits [S, V] in place: -inf where bit v of bitmask [S, ceil(V / 32)] int32 is 0, in the rows listed by
    rows [R] int32 only (kernels/token_bitmask.py)."""
    if use_triton(logits):
        from kernels.token_bitmask import apply_token_bitmask as kernel

        return kernel(logits, bitmask, rows)
    return apply_token_bitmask_ref(logits, bitmask, rows)
