"""Tile sweeps of the memory-bound kernels (`python -m bench.kernels --sweep`): rows or tokens
per program and warps, at the sizes where the defaults miss 85% of copy bandwidth.

Legend as in small_kernel_suite.py (T tokens, H hidden size, D = 128, GQA 4, bf16).
Every variant is timed as a CUDA graph of calls over rotated inputs, like the main suite,
and checked against the default variant's output (a variant that computes something
else shows a nonzero max diff).
"""

from __future__ import annotations

import functools
import itertools

import torch

from bench.kernel_math import SMALL_KERNEL_BYTES
from bench.kernel_timing import Bench, gbps
from bench.small_kernel_suite import OPS, make_inputs

# op -> (the launcher's tile key for work per program, its values); warps swept for every op
WORK_PER_PROGRAM = {
    "rms_norm": ("BLOCK_R", (1, 2, 4, 8)),
    "fused_add_rms_norm": ("BLOCK_R", (1, 2, 4, 8)),
    "rope": ("BLOCK_T", (1, 2, 4, 8, 16)),
    "store_kv": ("BLOCK_T", (1, 2, 4, 8, 16)),
    "rope_store_kv": ("BLOCK_T", (1, 2, 4, 8, 16)),
}
WARPS = (2, 4, 8, 16)
CASES = [(op, 4096, 2048) for op in WORK_PER_PROGRAM] + [
    ("store_kv", 4096, 4096), ("store_kv", 32768, 2048), ("rope_store_kv", 4096, 4096), ("rope", 4096, 4096),
]  # fmt: skip


def _outputs(op: str, args: tuple) -> list[torch.Tensor]:
    """What the op wrote or returned, for comparing variants (in-place ops write into their args)."""
    if op == "rope":
        return [args[0], args[1]]
    if op == "store_kv":
        return [args[2], args[3]]
    if op == "rope_store_kv":
        return [args[0], args[5], args[6]]
    return []


def sweep_small(bench: Bench, cases=CASES, warps=WARPS, dtype: torch.dtype = torch.bfloat16,
                bandwidth_gbps: float | None = None) -> list[dict]:  # fmt: skip
    rows = []
    elem = torch.finfo(dtype).bits // 8
    for op, tokens, hidden in cases:
        kernel = OPS[op][0]
        nbytes = SMALL_KERNEL_BYTES[op](tokens, hidden, elem)
        inputs = [make_inputs(op, tokens, hidden, bench.device, dtype) for _ in range(bench.rotations(nbytes))]
        key, values = WORK_PER_PROGRAM[op]
        check_args = make_inputs(op, tokens, hidden, bench.device, dtype)
        expected = _run_copy(op, kernel, check_args, None)
        for work, num_warps in itertools.product(values, warps):
            tiles = {key: work, "num_warps": num_warps}
            row = {"op": op, "T": tokens, "H": hidden, key: work, "num_warps": num_warps}
            try:
                call = functools.partial(kernel, tiles=tiles)
                ms, timing = bench.measure(call, inputs, graph=True)
                got = _run_copy(op, kernel, check_args, tiles)
                diff = max((float((g.float() - e.float()).abs().nan_to_num(0.0).max()) for g, e in zip(got, expected)),
                           default=0.0)  # fmt: skip
                row.update(us=ms * 1e3, gbps=gbps(nbytes, ms), timing=timing, max_diff=diff)
                if bandwidth_gbps:
                    row["frac_bw"] = row["gbps"] / bandwidth_gbps
            except Exception as e:  # noqa: BLE001 - a tile that does not compile is a result, not a crash
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
        del inputs, check_args, expected
        bench.free()
    return rows


def _run_copy(op: str, kernel, args: tuple, tiles: dict | None) -> list[torch.Tensor]:
    """Runs the kernel on fresh copies of args; returns its outputs."""
    fresh = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {} if tiles is None else {"tiles": tiles}
    result = kernel(*fresh, **kwargs)
    if result is None:
        return _outputs(op, fresh)
    return list(result) if isinstance(result, tuple) else [result]
