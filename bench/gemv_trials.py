"""One-token GEMV load schedules against kernels/gemv.py, in one run:
`python -m bench.gemv_trials --out DIR` (GPU) or `--dry-run` (CPU interpreter, tiny shapes).

Why: kernels/gemv.py's loop (num_stages has no effect on it: Triton pipelines only loads that feed
a tl.dot) issues one chunk's weight load, then waits for it in the multiply-add before it issues
the next: one 16-byte load in flight per thread, so each program's K loop is a chain of DRAM round
trips. At the Llama-3.2-1B shapes (fewer programs, fewer bytes in flight an SM) that reads
2048 x 8192 at 67% and 2048 x 2048 at 47% of the read bandwidth (H100, session 6's sweep). Trials:
- PREFETCH: the loads of the next two chunks are in flight while a chunk is multiplied;
- X2D: x is read as a [BLOCK_N, BLOCK_K] broadcast in the weight tile's layout (L1 hits), instead
  of one [BLOCK_K] row that Triton moves into that layout through shared memory (two barriers a
  chunk);
- EARLY: chunks loaded before the PDL wait (1 or 2), so the question of session 10's 'wider first
  chunk' (3-5x slower in the engine) is asked again of this schedule.
Every trial is checked against fp32 F.linear, and timed as a CUDA graph of 20 calls over weights
rotated through more than the L2, with PDL (each call's weight loads overlap the call before, as in
the engine's decode graph; --no-pdl-too: also without).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and "--dry-run" in sys.argv:  # before triton is imported (kernels/interpreter.py)
    from kernels.interpreter import use_cpu_interpreter

    use_cpu_interpreter()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.gemv_sweep import L2_BYTES, SHAPES, _graph_us, _rotating, trial_device, write_trials  # noqa: E402
from bench.report import table  # noqa: E402
from kernels._pdl import pdl_launch_dependents, pdl_wait  # noqa: E402
from kernels.gemv import gemv, weight_chunk, x_tile  # noqa: E402

# (BLOCK_N, BLOCK_K, PREFETCH, X2D, EARLY, num_warps)
TRIALS = [(4, 512, 0, 0, 1, 8), (4, 512, 0, 1, 1, 8), (4, 512, 1, 0, 1, 8), (4, 512, 1, 1, 1, 8),
          (4, 512, 1, 1, 2, 8), (4, 512, 1, 1, 1, 4), (8, 512, 1, 1, 1, 8), (2, 512, 1, 1, 1, 4),
          (4, 1024, 1, 1, 1, 8), (8, 256, 1, 1, 1, 4), (4, 256, 1, 1, 1, 4), (16, 256, 1, 1, 1, 8)]  # fmt: skip
KEYS = ("BLOCK_N", "BLOCK_K", "PREFETCH", "X2D", "EARLY", "num_warps")


@triton.jit
def _x_chunk(x_ptr, n, k, k_mask, X2D: tl.constexpr):
    # NOTE: one return: Triton refuses a return under a constexpr if followed by another
    if X2D:
        x = x_tile(x_ptr, n, k, k_mask)  # kernels/gemv.py's layout
    else:
        x = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]  # the layout it replaced
    return x


@triton.jit
def _trial_gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREFETCH: tl.constexpr, X2D: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    pdl_launch_dependents(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = w_ptr + n[:, None].to(tl.int64) * stride_wn
    w = weight_chunk(rows, n_mask, 0, K, BLOCK_K)
    if PREFETCH and EARLY == 2:
        w_next = weight_chunk(rows, n_mask, BLOCK_K, K, BLOCK_K)
    pdl_wait(PDL)
    if PREFETCH and EARLY == 1:
        w_next = weight_chunk(rows, n_mask, BLOCK_K, K, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if PREFETCH:
            w_after = weight_chunk(rows, n_mask, k0 + 2 * BLOCK_K, K, BLOCK_K)
        k = k0 + tl.arange(0, BLOCK_K)
        acc += w.to(tl.float32) * _x_chunk(x_ptr, n, k, k < K, X2D)
        if PREFETCH:
            w = w_next
            w_next = w_after
        else:
            w = weight_chunk(rows, n_mask, k0 + BLOCK_K, K, BLOCK_K)
    tl.store(y_ptr + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_mask)


def trial_gemv(x: torch.Tensor, w: torch.Tensor, trial: tuple, pdl: bool) -> torch.Tensor:
    t = dict(zip(KEYS, trial))
    y = torch.empty(1, w.shape[0], device=x.device, dtype=x.dtype)
    _trial_gemv_kernel[(triton.cdiv(w.shape[0], t["BLOCK_N"]),)](
        x, w, y, w.shape[0], w.shape[1], w.stride(0), BLOCK_N=t["BLOCK_N"], BLOCK_K=t["BLOCK_K"],
        PREFETCH=t["PREFETCH"], X2D=t["X2D"], EARLY=t["EARLY"], PDL=pdl, launch_pdl=pdl,
        num_warps=t["num_warps"], num_stages=1,
    )  # fmt: skip
    return y


def _check(y: torch.Tensor, reference: torch.Tensor) -> float:
    return ((y.float() - reference).abs().max() / reference.abs().max()).item()


def run_shape(num_out: int, num_in: int, read_bw: float | None, device: torch.device, dry: bool,
              pdl_modes: tuple[bool, ...] = (True,)) -> list[dict]:  # fmt: skip
    copies = 1 if dry else max(2, int(L2_BYTES // (num_out * num_in * 2)) + 1)
    dtype = torch.float32 if dry else torch.bfloat16
    weights = [torch.randn(num_out, num_in, device=device, dtype=dtype) for _ in range(copies)]
    x = torch.randn(1, num_in, device=device, dtype=dtype)
    reference = F.linear(x.float(), weights[0].float())
    gigabytes = num_out * num_in * 2 / 1e9
    rows = []
    candidates = [("kernels.gemv", None)] + [("trial", trial) for trial in TRIALS]
    for name, trial in candidates:
        for pdl in (False,) if dry else pdl_modes:
            row = {"N": num_out, "K": num_in, "kernel": name, "pdl": pdl, **dict(zip(KEYS, trial or ()))}
            call = (lambda w: gemv(x, w)) if trial is None else (lambda w, t=trial, p=pdl: trial_gemv(x, w, t, p))
            try:
                row["max_rel_diff"] = _check(call(weights[0]), reference)
                if not dry:
                    from kernels._pdl import set_pdl

                    set_pdl(pdl)  # kernels.gemv follows the process setting
                    row["us"] = _graph_us(_rotating(weights, call))
                    row["of_read_bw"] = gigabytes / (row["us"] * 1e-6) / read_bw
                    set_pdl(None)
            except Exception as exc:  # a trial that does not compile is a row that says so
                row["error"] = f"{type(exc).__name__}: {str(exc)[-600:]}"
            rows.append(row)
            print(row, flush=True)
    return rows


def _markdown(result: dict) -> str:
    rows = [{**row, "shape_nk": f"{row['N']} x {row['K']}"} for row in result["rows"]]
    return f"# One-token GEMV trials\n\n{result['meta']}\n\n" + table(rows, [
        ("shape", "shape", ""), ("shape_nk", "N x K", ""), ("kernel", "kernel", ""),
        *((key, key, "") for key in KEYS), ("pdl", "PDL", ""), ("us", "us", ".1f"),
        ("of_read_bw", "of read BW", ".0%"), ("max_rel_diff", "max rel diff", ".1e"), ("error", "error", ""),
    ], drop_absent=True) + "\n"  # fmt: skip


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    parser.add_argument("--no-pdl-too", action="store_true", help="also time every trial without PDL")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of bench.gemv_sweep.SHAPES")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device, read_bw, meta = trial_device(args.dry_run)
    shapes = {"tiny": (12, 1100)} if args.dry_run else {name: SHAPES[name] for name in args.shapes.split(",")}
    rows = []
    pdl_modes = (True, False) if args.no_pdl_too else (True,)
    for name, (num_out, num_in) in shapes.items():
        shape_rows = run_shape(num_out, num_in, read_bw, device, args.dry_run, pdl_modes)
        rows += [{"shape": name, **row} for row in shape_rows]
    result = {"meta": meta, "rows": rows}
    return write_trials(args.out, "gemv_trials", result, _markdown(result))


if __name__ == "__main__":
    main()
