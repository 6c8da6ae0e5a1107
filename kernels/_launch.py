"""What every launcher checks before it starts a Triton kernel, in one place.

The launchers reject what their kernel does not support with a ValueError that
names the argument and the limit, so a wrong call fails in Python instead of
reading out of bounds on the GPU.

NOTE: `triton.jit` decides at decoration time (when a kernels module is first
imported) whether it builds a GPU kernel or a CPU interpreter function, from
TRITON_INTERPRET. A CPU tensor reaching a GPU kernel is caught here with a
message that says so, instead of a crash deep inside Triton.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)


def check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")


def check_index(name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")


def check_same_dtype(names: str, *tensors: torch.Tensor) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"{names} must share one dtype, got {[t.dtype for t in tensors]}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_device(kernel, names: str, *tensors: torch.Tensor) -> None:
    """All tensors on one device, and a device the kernel object can run on."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{names} must be on one device, got {sorted(str(d) for d in devices)}")
    device = next(iter(devices))
    on_interpreter = not isinstance(kernel, triton.runtime.JITFunction)
    if device.type == "cpu" and not on_interpreter:
        raise ValueError(
            f"{names} are on the CPU but Triton kernels were built for the GPU; set TRITON_INTERPRET=1 "
            "before kernels is first imported to run them on the CPU interpreter"
        )
    if device.type == "cuda" and on_interpreter:
        raise ValueError(f"{names} are on {device} but TRITON_INTERPRET=1 built CPU interpreter kernels")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{names} must be on cuda (or cpu under TRITON_INTERPRET=1), got {device}")


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The dtype attention kernels feed to tl.dot.

    NOTE: Triton 3.6's interpreter multiplies bfloat16 tiles as their raw uint16
    bits in tl.dot (garbage results), so under the interpreter bf16 tiles are
    widened to fp32 first; products of bf16 values are exact in fp32, so only
    the rounding of P before P @ V differs from the GPU path.
    """
    if dtype == torch.bfloat16 and interpreting():
        return tl.float32
    return tl_dtype(dtype)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get true fp32 products (not TF32) so the fp32 contract holds."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (0 on CPU)."""
    if device.type != "cuda":
        return 0
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=8)
def _major_capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def has_tma(device: torch.device) -> bool:
    """Whether a CUDA device has the tensor memory accelerator (Hopper, sm_90, or later); looked up
    once per device, as the launchers ask on every call."""
    if device.type != "cuda":
        return False
    return _major_capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


_TICKETS: dict[tuple[torch.device, int], torch.Tensor] = {}
_OUTGROWN_TICKETS: list[torch.Tensor] = []  # replaced buffers stay alive: a captured CUDA graph may still use them
MIN_TICKETS = 1 << 16  # 256 KB of int32: no growth below 65536 counters


def ticket_counters(num: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters (at least `num`) for kernels whose last program of a group merges
    the group's partial results: each program takes a ticket (atomic add) and the one that
    draws the last puts the counter back to 0, so the buffer is all zero between kernels.

    NOTE: one buffer per (device, stream), shared by every such kernel (split decode attention,
    greedy sampling): kernels on one stream run one after another, so they never share a
    counter while it is counting, and a second stream gets its own buffer.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    counters = _TICKETS.get(key)
    if counters is None or counters.numel() < num:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # NOTE: made now, they would live in the graph pool, where another graph's temporaries may
            # overwrite them: run the kernel once on the capturing stream before capturing
            raise RuntimeError(
                f"ticket counters ({num}) first needed while capturing a CUDA graph; warm up on the capture stream"
            )
        if counters is not None:
            _OUTGROWN_TICKETS.append(counters)
        counters = torch.zeros(max(num, MIN_TICKETS), dtype=torch.int32, device=device)
        _TICKETS[key] = counters
    return counters


def warps_for(elements: int) -> int:
    """Warps for a memory-bound tile: enough threads for 16-byte accesses, at most 16 warps."""
    if elements <= 2048:
        return 4
    if elements <= 8192:
        return 8
    return 16


def as_row_grid(x: torch.Tensor) -> torch.Tensor:
    """x [..., N] as a view [A, B, N] (rows = A*B) without a copy where the strides allow.

    Two row dims cover a contiguous [T, N] tensor and a per-head view [T, H, D] cut
    out of a fused projection (Qwen3's q/k norm), whose T and H dims cannot merge.
    """
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(0)
    if x.dim() == 3:
        return x
    try:
        return x.view(-1, x.shape[-2], x.shape[-1])
    except RuntimeError:  # leading dims not mergeable: one copy
        return x.reshape(-1, x.shape[-2], x.shape[-1])


def spread_block(numel: int, max_block: int = 2048, min_block: int = 256, target_programs: int = 264) -> int:
    """Elements per program for an elementwise kernel: whole 2048-element tiles when the
    tensor is large, smaller tiles when it is small so that its few kilobytes still spread
    over many SMs, as torch.compile's kernels do (decision 0034)."""
    wanted = triton.next_power_of_2(max(1, -(-numel // target_programs)))
    return max(min_block, min(max_block, wanted))


def warps_for_block(block: int) -> int:
    """One warp per 256 elements (8 bf16 = 16 bytes per thread), 1 to 8 warps."""
    return max(1, min(8, block // 256))


TOKEN_TILE_ELEMENTS = 4096  # elements per program and head chunk of the per-token kernels (KV store, RoPE)
TOKEN_TILE_KEYS = ("BLOCK_T", "num_warps")


def token_tile(
    num_tokens: int,
    head_elements: int,
    device: torch.device,
    tiles: dict | None,
    max_tokens: int = 64,
    tile_elements: int = TOKEN_TILE_ELEMENTS,
) -> dict:
    """BLOCK_T (tokens per program) and num_warps for a memory-bound kernel over [T, head_elements] rows.

    As many tokens as fit tile_elements (at most max_tokens), but no fewer programs
    than two per SM, so a small batch still spreads over the GPU. The interpreter gets 2
    so that odd token counts cross a tile border in the CPU tests (every kernel takes any
    BLOCK_T). `tiles` overrides BLOCK_T or num_warps.
    """
    if interpreting() or device.type != "cuda":
        block_t = 2
    else:
        by_size = min(max_tokens, max(1, tile_elements // head_elements))
        by_spread = max(1, num_tokens // (2 * num_sms(device)))
        block_t = min(triton.next_power_of_2(by_size), 1 << (by_spread.bit_length() - 1))
    unknown = set(tiles or {}) - set(TOKEN_TILE_KEYS)
    if unknown:
        raise ValueError(f"tiles may set only {TOKEN_TILE_KEYS}, got {sorted(unknown)}")
    config = dict(BLOCK_T=block_t, num_warps=warps_for(block_t * head_elements))
    config.update(tiles or {})
    if config["BLOCK_T"] < 1 or config["BLOCK_T"] & (config["BLOCK_T"] - 1):
        raise ValueError(f"BLOCK_T must be a power of two, got {config['BLOCK_T']}")
    return config
