"""Tunes the MoE kernels' path and tiles on this GPU and writes kernels/moe_configs/<GPU>.json (kernels/moe_tiles.py
reads it; commit the file).

    python -m bench.moe_tune --models Qwen3-30B-A3B,Mixtral-8x7B      # on a CUDA GPU, from the repo root
    python -m bench.moe_tune --dry-run --config-dir /tmp/moe-configs  # CPU interpreter: the code paths only

Per MoE shape (from bench/configs/<model>/config.json, or --shape E,K,H,I), with a random routing (about
uniform, as random weights route) of bf16 inputs, it times the routed experts (CUDA-graph replays,
bench/kernel_timing.py). First, at one token, the one-token kernels' tiles (`gemv`): gate|up, then down
(the other at its best so far), over (BLOCK_N, BLOCK_K) unrolled on 8 warps, then the best as a loop and on
4 warps. Then per token count T, the one-token path at those tiles and the grouped path with each candidate
tile, in two sweeps: a coarse one over the tile's (BLOCK_M, BLOCK_N, BLOCK_K) at 4 warps, 3 stages,
GROUP_M 8; then a refined one over warps, stages and GROUP_M around the best two. It records the best grouped
tile per T and the largest T up to which the one-token path wins at every measured count
(`small_batch_max_tokens`, 0 where it never does). A shape's entry is replaced whole; other shapes' entries
in the file stay. --budget-s stops a shape's sweep early (the counts measured so far are written; the
heuristic serves the rest).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
import time
from pathlib import Path

import torch

TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192)
SHARED_MEMORY_LIMIT = 200 * 1024  # bytes of a program's pipelined tiles (H100: 227 KB a block)
COARSE_FIXED = {"num_warps": 4, "num_stages": 3, "GROUP_M": 8}
REFINED_CHOICES = {"num_warps": (4, 8), "num_stages": (3, 4), "GROUP_M": (1, 16)}
GEMV_COARSE = ((2, 512), (4, 256), (4, 512), (4, 1024), (8, 256), (8, 512))  # (BLOCK_N, BLOCK_K)
GEMV_REFINED = ({"UNROLL": False}, {"num_warps": 4})  # each over the best coarse tile
# NOTE: every candidate tile is two compiled kernels (~1 s each): the sweeps stay small so that a shape's sweep
# fits a device call (vLLM's full sweep takes hours a shape)


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="Qwen3-30B-A3B,Qwen1.5-MoE-A2.7B,Mixtral-8x7B",
                        help="bench/configs names whose MoE layer shape to tune")  # fmt: skip
    parser.add_argument("--shape", action="append", default=[], help="E,K,H,I of another shape (repeatable)")
    parser.add_argument("--tokens", default="", help="comma-separated token counts (default: 1..8192)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="seconds of sweeping per shape")
    parser.add_argument("--config-dir", type=Path, default=None, help="where to write (default: kernels/moe_configs)")
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter, a tiny shape, two candidates")
    return parser.parse_args(argv)


def model_shape(name: str) -> tuple[int, int, int, int]:
    """(E, K, H, I) of a bench config's routed experts, read as the engine reads them."""
    from bench.engine_common import CONFIGS
    from engine.model_loader import load_hf_config
    from engine.models.moe_spec import moe_spec
    from engine.models.registry import resolve_model_class

    config = load_hf_config(CONFIGS / name)
    model_class = resolve_model_class(config)
    fields = getattr(model_class, "MOE_FIELDS", None)
    if fields is None:
        raise SystemExit(f"{name} ({model_class.__name__}) has no experts to tune")
    spec = moe_spec(config, fields, model_class.__name__)
    return spec.num_experts, spec.top_k, int(config.hidden_size), spec.intermediate_size


def fits(tile: dict, element_bytes: int = 2) -> bool:
    """Whether the gated GEMM's pipelined tiles (one of x, two of weights a stage) fit SHARED_MEMORY_LIMIT."""
    from kernels.moe_tiles import shared_bytes

    return shared_bytes(tile, element_bytes) <= SHARED_MEMORY_LIMIT


def coarse_tiles(num_tokens: int, num_experts: int, top_k: int) -> list[dict]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) candidates: row tiles up to twice the expected rows per expert."""
    rows = -(-num_tokens * top_k // num_experts)
    heights = [m for m in (16, 32, 64, 128) if m == 16 or m <= 2 * rows]
    tiles = [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, **COARSE_FIXED}
             for m, n, k in itertools.product(heights, (64, 128), (64, 128))]  # fmt: skip
    return [t for t in tiles if fits(t)]


def refined_tiles(best: list[dict]) -> list[dict]:
    tiles = []
    for base in best:
        for warps, stages, group in itertools.product(*REFINED_CHOICES.values()):
            tile = {**base, "num_warps": warps, "num_stages": stages, "GROUP_M": group}
            if fits(tile) and tile not in tiles:
                tiles.append(tile)
    return tiles


def small_batch_max_tokens(gemv_us: dict[int, float], grouped_us: dict[int, float]) -> int:
    """The largest measured T such that the one-token path is at least as fast at every measured count up to it."""
    best = 0
    for tokens in sorted(gemv_us):
        if tokens not in grouped_us or gemv_us[tokens] > grouped_us[tokens]:
            break
        best = tokens
    return best


def merged_table(path: Path, key: str, entry: dict, meta: dict) -> dict:
    """The file's table with `key`'s entry replaced and the run's metadata beside it."""
    table = json.loads(path.read_text()) if path.is_file() else {}
    table[key] = entry
    table.setdefault("_runs", {})[key] = meta
    return dict(sorted(table.items()))


def gemv_candidates(kernel: str, dry_run: bool) -> list[dict]:
    """The one-token kernels' coarse tiles (kernels/moe_gemv.py's TILE_KEYS); two small ones on the interpreter."""
    from kernels.moe_gemv import TILE

    if dry_run:
        return [{**TILE, "BLOCK_N": n, "BLOCK_K": 16, "num_warps": 1} for n in (2, 4)]
    return [{**TILE, "BLOCK_N": n, "BLOCK_K": k} for n, k in GEMV_COARSE]


def tune_gemv(timed, dry_run: bool) -> tuple[dict, dict]:
    """({"gate_up": tile, "down": tile}, {kernel: {tile as text: us}}) at one token: each kernel's coarse sweep,
    then its best tile as a loop and on 4 warps; the other kernel at its best so far."""
    from kernels.moe_tiles import GEMV_KERNELS

    best = dict.fromkeys(GEMV_KERNELS)
    times = {}
    for kernel in best:
        scored = []

        def score(tile: dict, kernel: str = kernel, scored: list = scored) -> None:
            others = {f"gemv_{k}": t for k, t in best.items() if k != kernel}
            scored.append((timed({"path": "gemv", f"gemv_{kernel}": tile, **others}), len(scored), tile))

        for tile in gemv_candidates(kernel, dry_run):
            score(tile)
        top = min(scored)[2]
        for change in () if dry_run else GEMV_REFINED:
            score({**top, **change})
        best[kernel] = min(scored)[2]
        times[kernel] = {json.dumps(tile, sort_keys=True): us for us, _, tile in scored}
        print(f"  gemv {kernel}: {min(scored)[0]:.1f} us {best[kernel]}", flush=True)
    return best, times


def tune_shape(bench, shape: tuple[int, int, int, int], tokens: tuple[int, ...], budget_s: float,
               dry_run: bool) -> dict:  # fmt: skip
    """{"small_batch_max_tokens", "gemv": {kernel: tile}, "grouped": {T: tile}, "us": {T: {"gemv", "grouped"}},
    "gemv_us": {kernel: {tile: us}}} of one shape."""
    from kernels.fused_moe import fused_experts
    from kernels.moe_router import moe_route

    num_experts, top_k, hidden, inter = shape
    dtype = torch.float32 if dry_run else torch.bfloat16
    started = time.monotonic()

    def inputs_at(num_tokens: int) -> list[tuple]:
        generator = torch.Generator(device=bench.device).manual_seed(num_tokens)
        x = torch.randn(num_tokens, hidden, generator=generator, device=bench.device).to(dtype)
        w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=generator, device=bench.device)
               * hidden**-0.5).to(dtype)  # fmt: skip
        w2 = (torch.randn(num_experts, hidden, inter, generator=generator, device=bench.device) * inter**-0.5).to(dtype)
        weights, ids = moe_route(torch.randn(num_tokens, num_experts, device=bench.device), top_k, True)
        return [(x, w13, w2, weights, ids)]

    def timer(inputs: list):
        def timed(tiles: dict) -> float:
            ms, _ = bench.measure(lambda *args: fused_experts(*args, tiles=tiles), inputs, True)
            return ms * 1e3

        return timed

    inputs = inputs_at(1)
    gemv, gemv_times = tune_gemv(timer(inputs), dry_run)
    gemv_tiles = {f"gemv_{kernel}": tile for kernel, tile in gemv.items()}
    del inputs
    bench.free()
    grouped, gemv_us, grouped_us = {}, {}, {}
    for num_tokens in tokens:
        if time.monotonic() - started > budget_s:
            print(f"budget spent: {shape} stops before {num_tokens} tokens", flush=True)
            break
        inputs = inputs_at(num_tokens)
        timed = timer(inputs)
        gemv_us[num_tokens] = timed({"path": "gemv", **gemv_tiles})
        candidates = coarse_tiles(num_tokens, num_experts, top_k)
        if dry_run:
            candidates = [dict(c, BLOCK_N=16, BLOCK_K=16, num_stages=1) for c in candidates[:2]]
        scored = sorted((timed({"path": "grouped", **tile}), i, tile) for i, tile in enumerate(candidates))
        if not dry_run:
            more = [t for t in refined_tiles([tile for _, _, tile in scored[:2]]) if t not in candidates]
            scored += [(timed({"path": "grouped", **t}), len(scored) + i, t) for i, t in enumerate(more)]
            scored.sort()
        grouped_us[num_tokens], _, grouped[str(num_tokens)] = scored[0]
        print(f"{shape} T={num_tokens}: gemv {gemv_us[num_tokens]:.1f} us, grouped {grouped_us[num_tokens]:.1f} us "
              f"{grouped[str(num_tokens)]}", flush=True)  # fmt: skip
        del inputs, timed
        bench.free()
    return {
        "small_batch_max_tokens": small_batch_max_tokens(gemv_us, grouped_us),
        "gemv": gemv,
        "grouped": grouped,
        "us": {str(t): {"gemv": gemv_us[t], "grouped": grouped_us[t]} for t in grouped_us},
        "gemv_us": gemv_times,
    }


def main(argv=None) -> dict:
    args = _parse_args(argv)
    if args.dry_run:
        from kernels.interpreter import use_cpu_interpreter

        use_cpu_interpreter()
    elif not torch.cuda.is_available():
        raise SystemExit("tuning needs a CUDA GPU (--dry-run runs the code paths on the CPU)")
    from bench.kernel_timing import Bench
    from kernels.moe_tiles import CONFIG_DIR, device_config_file, moe_shape_key

    device = torch.device("cpu" if args.dry_run else "cuda")
    bench = Bench.on(device, args.dry_run)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape]
    if args.dry_run:
        shapes = shapes or [(5, 2, 32, 16)]
    else:
        shapes += [model_shape(name) for name in filter(None, args.models.split(","))]
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else ((1, 3) if args.dry_run else TOKENS)
    gpu = "cpu-interpreter" if args.dry_run else torch.cuda.get_device_name(device)
    path = (args.config_dir or CONFIG_DIR) / device_config_file(gpu).name
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    meta = {"gpu": gpu, "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    import triton

    meta["triton"] = triton.__version__
    done = {}
    for shape in shapes:
        key = moe_shape_key(shape[0], shape[1], shape[2], shape[3], dtype)
        done[key] = tune_shape(bench, shape, tokens, args.budget_s, args.dry_run)
        path.write_text(json.dumps(merged_table(path, key, done[key], meta), indent=1) + "\n")
        print(f"wrote {key} to {path}", flush=True)
    return done


if __name__ == "__main__":
    main(sys.argv[1:])
