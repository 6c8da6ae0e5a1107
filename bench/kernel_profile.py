"""The kernels whose goals are missed, each launched once inside a profiler range, for
Nsight Compute (the evidence behind the misses in the kernel notes).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python3 -m bench.kernel_profile          # on the GPU; bench/run_gpu_kernels.sh does this

Every case is built and run once before the range opens (compiles and autotuning stay
outside it); inside the range each case's kernels run exactly once. Legend and shapes
as in attention_suites.py and small_kernel_suite.py (GQA 32/8 or 4, D = 128, bf16).
"""

from __future__ import annotations

import math
import sys

import torch

from bench.attention_suites import paged_pool
from bench.small_kernel_suite import OPS, make_inputs
from kernels.decode_attention import paged_decode_attention
from kernels.prefill_attention import paged_prefill_attention


def _decode_case(batch: int, context: int, num_splits: int | None):
    k = torch.randn(batch, context, 8, 128, device="cuda").to(torch.bfloat16)
    kv_cache, block_tables = paged_pool(k, torch.randn_like(k), 16)
    q = torch.randn(batch, 32, 128, device="cuda").to(torch.bfloat16)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    args = (q, kv_cache[0], kv_cache[1], block_tables, seq_lens, 1 / math.sqrt(128))
    return lambda: paged_decode_attention(*args, num_splits=num_splits)


def _prefill_case(seq_len: int, batch: int):
    q = torch.randn(batch * seq_len, 32, 128, device="cuda").to(torch.bfloat16)
    k = torch.randn(batch, seq_len, 8, 128, device="cuda").to(torch.bfloat16)
    kv_cache, block_tables = paged_pool(k, torch.randn_like(k), 16)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, batch * seq_len + 1, seq_len, dtype=torch.int32, device="cuda")
    args = (q, kv_cache[0], kv_cache[1], block_tables, seq_lens, starts, seq_len, 1 / math.sqrt(128))
    return lambda: paged_prefill_attention(*args)


def _small_case(op: str, tokens: int, hidden: int):
    args = make_inputs(op, tokens, hidden, torch.device("cuda"), torch.bfloat16)
    return lambda: OPS[op][0](*args)


CASES = {
    "decode_b16_l4k_default": lambda: _decode_case(16, 4096, None),
    "decode_b16_l4k_2splits": lambda: _decode_case(16, 4096, 2),
    "decode_b256_l1k": lambda: _decode_case(256, 1024, None),
    "decode_b1_l64k": lambda: _decode_case(1, 65536, None),
    "prefill_s1k_b16": lambda: _prefill_case(1024, 16),
    "rms_norm_4096x2048": lambda: _small_case("rms_norm", 4096, 2048),
    "rope_4096x2048": lambda: _small_case("rope", 4096, 2048),
    "store_kv_4096x2048": lambda: _small_case("store_kv", 4096, 2048),
    "store_kv_32768x2048": lambda: _small_case("store_kv", 32768, 2048),
    "rope_store_kv_4096x2048": lambda: _small_case("rope_store_kv", 4096, 2048),
}


def main(argv: list[str]) -> None:
    names = argv or list(CASES)
    calls = []
    for name in names:
        call = CASES[name]()
        call()  # compile outside the profiled range
        calls.append((name, call))
    torch.cuda.synchronize()
    for name, call in calls:
        print(f"[profile] {name}", flush=True)
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
