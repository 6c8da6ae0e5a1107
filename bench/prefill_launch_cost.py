"""Host cost of one prefill attention launch, TMA boxes against pointer gathers:
`python -m bench.prefill_launch_cost --out DIR` (GPU).

Why: with TMA boxes the launcher hands Triton two TensorDescriptors, which its launcher encodes on the
host at every call (cuTensorMapEncodeTiled, plus Python around it). Session 13 saw the 8B 128-token
prompt's prefill host time at 1.30 against 0.73 ms in one run, and the 1B the other way: this times
the launch alone. Per prompt length: the host time of a call (a loop of launches with the GPU kept
busy in front of it, so the launch queue never waits) and the GPU time (CUDA events around a loop
queued behind a sleep, so that the kernels run back to back).
The engine's shape: Llama-3.1-8B heads (32 / 8, D = 128), bf16, 64-token blocks.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

from kernels.prefill_attention import paged_prefill_attention

PROMPTS = (16, 128, 512, 2048)
CALLS = 200
POINTER = dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=4, USE_TMA=False)
TMA = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True)


def _inputs(prompt: int, device: torch.device) -> tuple:
    heads, kv_heads, dim, block = 32, 8, 128, 64
    blocks = -(-prompt // block)
    q = torch.randn(prompt, heads, dim, device=device, dtype=torch.bfloat16)
    k_cache = torch.randn(blocks + 1, block, kv_heads, dim, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.arange(1, blocks + 1, device=device, dtype=torch.int32)[None]
    seq_lens = torch.tensor([prompt], device=device, dtype=torch.int32)
    starts = torch.tensor([0, prompt], device=device, dtype=torch.int32)
    return q, k_cache, v_cache, tables, seq_lens, starts, prompt, dim**-0.5


def _time(args: tuple, tiles: dict) -> dict:
    call = lambda: paged_prefill_attention(*args, tiles=tiles)  # noqa: E731
    reference = call()
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # keep the GPU busy so the host loop below never waits for it
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    host_us = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # the launches queue up behind it, so the events time the GPU alone. NOTE: it must outlast the
    # launches (~100 ms in cycles here): session 14's run slept 25 ms, less than 200 TMA launches of a
    # 16-token prompt took on the host (30 ms), and so read 25 us for a kernel of ~6
    torch.cuda._sleep(200_000_000)
    begin.record()
    for _ in range(CALLS):
        call()
    end.record()
    torch.cuda.synchronize()
    return {"host_us": host_us, "gpu_us": begin.elapsed_time(end) / CALLS * 1e3, "out": reference}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for prompt in PROMPTS:
        inputs = _inputs(prompt, device)
        pointer, tma = _time(inputs, POINTER), _time(inputs, TMA)
        diff = (pointer.pop("out").float() - tma.pop("out").float()).abs().max().item()
        rows.append({"prompt": prompt, "pointer": pointer, "tma": tma, "max_diff": diff})
        print(rows[-1], flush=True)
    meta = f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}"
    lines = [f"# Prefill attention launch cost\n\n{meta} · 8B heads, bf16, 64-token blocks, {CALLS} calls\n",
             "| prompt | pointer host us | TMA host us | pointer GPU us | TMA GPU us |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        p, t = r["pointer"], r["tma"]
        cells = (r["prompt"], f"{p['host_us']:.1f}", f"{t['host_us']:.1f}", f"{p['gpu_us']:.1f}", f"{t['gpu_us']:.1f}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    result = {"meta": meta, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_launch_cost.json").write_text(json.dumps(result, indent=1))
    (args.out / "prefill_launch_cost.md").write_text("\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
