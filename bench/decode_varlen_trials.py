"""Trial for the offline workload's decode steps: decode attention over a batch of mixed context lengths,
in the order the batch comes and sorted by length.

    python -m bench.decode_varlen_trials --out DIR     # GPU
    python -m bench.decode_varlen_trials --dry-run     # CPU interpreter, tiny shapes, correctness only

Why: the kernel bench's decode rows give every sequence one length and read 96-97% of the measured
bandwidth at B = 64..256, but the offline benchmark's graphed decode steps, whose batches hold contexts
of ~100 to ~2000 tokens, reached 78% of their floor (Qwen3-0.6B, session 10's run:
bench/results/h100/engine_offline_throughput_before_length_order.md).
With S x Hkv programs enough to fill the GPU, decode attention takes one split: one program a (sequence,
KV head), whose time grows with its context. Programs are dispatched in grid order, so a long sequence
whose programs start in the last wave leaves a tail that the short ones cannot fill.

Rows, each the same total of keys (bytes = K and V of every sequence's context, read once):
- uniform: every sequence at the mean length (the kernel bench's kind of row);
- mixed, as scheduled: lengths uniform in [lo, hi], in random order;
- mixed, longest first / shortest first: the same batch permuted (q, block tables, lengths): the grid
  then takes the sequences in that order, but each KV head's programs after the last head's;
- mixed, kernel order: the batch as scheduled with `order` (kernels/decode_grid.py's length_order):
  the grid takes the longest sequence first, each sequence's KV heads together (the engine passes it
  where wants_length_order says; session 18's call 8 also timed chunks of 16 sequences, heads outermost
  within a chunk, and found no difference, so that variant is gone);
- mixed, kernel mapping, random order: the same grid mapping over a random permutation (no sort);
- uniform and mixed with the context split in P = 2, 3, 4 (the engine's rule takes one split where the
  batch's programs fill the GPU twice over): splits even out long and short sequences' programs.

Measured (H100, session 18, bench/results/h200/decode_session18/README.md): at B = 256 the mixed batch
read 91% of the bandwidth as scheduled and 96% in the kernel order (equal lengths 95-96%); B = 128 83% ->
94%; B = 64 got slower in the kernel order (81% -> 75%), so the engine orders only grids of more than one
wave. Splits helped mixed batches at B = 64-128 by up to 5 points and cost equal-length ones 3-6.
"""

from __future__ import annotations

import json
import math
import sys

if __name__ == "__main__" and "--dry-run" in sys.argv:  # before triton is imported (kernels/interpreter.py)
    from kernels.interpreter import use_cpu_interpreter

    use_cpu_interpreter()

import torch

# (model, Hq, Hkv, D, batch, shortest, longest): the offline workload's contexts, prompt and output each
# uniform in [100, 1024]
CASES = (("Qwen3-0.6B", 16, 8, 128, 256, 100, 2048), ("Llama-3.1-8B", 32, 8, 128, 256, 100, 2048),
         ("Qwen3-0.6B", 16, 8, 128, 128, 100, 2048), ("Qwen3-0.6B", 16, 8, 128, 96, 100, 2048),
         ("Qwen3-0.6B", 16, 8, 128, 64, 100, 2048), ("Qwen3-0.6B", 16, 8, 128, 48, 100, 2048),
         ("Qwen3-0.6B", 16, 8, 128, 32, 100, 2048), ("Qwen3-0.6B", 16, 8, 128, 24, 100, 2048))  # fmt: skip
DRY_CASES = (("tiny", 4, 1, 64, 5, 3, 40),)
SPLITS = (2, 3, 4)


def batch_inputs(num_heads, num_kv_heads, head_dim, lens: list[int], device, dtype, block_size):
    """(q, k_cache, v_cache, block_tables, seq_lens) of a decode batch with these context lengths."""
    from bench.attention_suites import paged_pool

    longest = max(lens)
    k = torch.randn(len(lens), longest, num_kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(len(lens), longest, num_kv_heads, head_dim, device=device).to(dtype)
    kv_cache, block_tables = paged_pool(k, v, block_size)
    q = torch.randn(len(lens), num_heads, head_dim, device=device).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, kv_cache[0], kv_cache[1], block_tables, seq_lens


def permuted(inputs: tuple, order: torch.Tensor) -> tuple:
    q, k_cache, v_cache, block_tables, seq_lens = inputs
    return q[order].contiguous(), k_cache, v_cache, block_tables[order].contiguous(), seq_lens[order].contiguous()


def run_case(
    bench, case: tuple, dtype, read_bw: float | None, block_size: int, splits_sweep: bool = True
) -> list[dict]:
    from kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
    from kernels.decode_grid import choose_num_splits, length_order

    name, num_heads, num_kv_heads, head_dim, batch, lo, hi = case
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(lo, hi + 1, (batch,), generator=gen).tolist()
    mean = round(sum(lens) / batch)
    scale = 1.0 / math.sqrt(head_dim)
    mixed = batch_inputs(num_heads, num_kv_heads, head_dim, lens, bench.device, dtype, block_size)
    expected = paged_decode_attention_ref(*mixed, scale)
    by_length = torch.tensor(lens).argsort(descending=True).to(bench.device)
    uniform = batch_inputs(num_heads, num_kv_heads, head_dim, [mean] * batch, bench.device, dtype, block_size)
    default = choose_num_splits(batch, num_kv_heads, bench.device)
    kernel_order = length_order(mixed[4])
    variants = [("uniform", uniform, None, default, None), ("as scheduled", mixed, None, default, None),
                ("longest first", permuted(mixed, by_length), by_length, default, None),
                ("shortest first", permuted(mixed, by_length.flip(0)), by_length.flip(0), default, None)]  # fmt: skip
    # the kernel's grid mapping (each sequence's KV heads together) over an unsorted permutation: what the
    # mapping does without the sort (B = 64 was slower in the kernel order, session 18)
    shuffled = torch.randperm(batch, generator=gen).to(bench.device)
    variants += [("kernel order", mixed, None, default, kernel_order),
                 ("kernel mapping, random order", mixed, None, default, shuffled)]  # fmt: skip
    for splits in SPLITS if splits_sweep else ():
        variants += [("uniform", uniform, None, splits, None), ("as scheduled", mixed, None, splits, None)]
    rows = []
    for order, inputs, perm, splits, grid_order in variants:
        out = paged_decode_attention(*inputs, scale, num_splits=splits, order=grid_order)
        if order != "uniform":  # the same batch in another order: the same outputs, row for row
            torch.testing.assert_close(out, expected[perm] if perm is not None else expected, atol=2e-2, rtol=2e-2)

        def call(*a, splits=splits, grid_order=grid_order):
            return paged_decode_attention(*a, scale, num_splits=splits, order=grid_order)

        ms, timing = bench.measure(call, [inputs], graph=True)
        keys = int(inputs[4].sum())
        nbytes = 2 * keys * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
        rows.append({"model": name, "B": batch, "lengths": f"{lo}-{hi}" if order != "uniform" else str(mean),
                     "order": order, "splits": splits, "us": ms * 1e3,
                     "gbps": nbytes / (ms * 1e-3) / 1e9, "timing": timing,
                     "of_read_bw": nbytes / (ms * 1e-3) / 1e9 / read_bw if read_bw else None})  # fmt: skip
    del mixed, uniform, variants
    bench.free()
    return rows


def _markdown(result: dict) -> str:
    from bench.report import table

    return "\n".join([
        "# Decode attention over mixed context lengths (bench/decode_varlen_trials.py)", "", result["meta"], "",
        table(result["rows"], [("model", "model", ""), ("B", "B", ""), ("lengths", "lengths", ""),
                               ("order", "order", ""), ("splits", "splits", ""), ("us", "us", ".1f"),
                               ("gbps", "GB/s", ".0f"), ("of_read_bw", "of read BW", ".0%")], drop_absent=True),
    ]) + "\n"  # fmt: skip


def main(argv=None) -> dict:
    from bench.attention_suites import POOL_BLOCK_SIZE
    from bench.gemv_sweep import trial_arguments, trial_device, write_trials
    from bench.kernel_timing import Bench

    args = trial_arguments(__doc__, argv)
    torch.manual_seed(0)
    device, read_bw, meta = trial_device(args.dry_run)
    bench = Bench.on(device, args.dry_run)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    rows = []
    for case in DRY_CASES if args.dry_run else CASES:
        rows += run_case(bench, case, dtype, read_bw, 16 if args.dry_run else POOL_BLOCK_SIZE)
    result = {"meta": meta, "rows": rows}
    print(json.dumps(rows, indent=1))
    return write_trials(args.out, "decode_varlen_trials", result, _markdown(result))


if __name__ == "__main__":
    main()
