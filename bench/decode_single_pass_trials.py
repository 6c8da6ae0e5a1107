"""Trial (session 23): batch-1 decode attention in one pass over the whole context, no split and so no
merge kernel, against the engine's split grid (flash-decoding, then kernels/decode_split_merge.py).

Why: in the graphed Llama-3.2-1B step (bench/results/h100/engine_decode_latency.md) decode attention and
its merge cost ~68 us over their floor (16 layers, ~4.3 us a layer for ~50 KB of keys and values): two
kernel boundaries a layer. With one split a sequence the kernel writes the output itself, and with a key
tile as wide as the bench's contexts (128 + up to 512 new tokens) most of the keys are loaded before the
PDL wait (the kernel's early first tile), while the qkv kernel before it still runs.

    python -m bench.decode_single_pass_trials --models Llama-3.2-1B --skip-hf \
        --single-pass 64:BLOCK_N=256,num_warps=8

--single-pass 'D:KEY=V,...;D:...': for head dim D, every decode attention call of the run takes one
split, its first tile before the wait, and these tiles (kernels/decode_attention.py TILE_KEYS). The rest
of the arguments are bench.decode_latency's. Patches the kernel module's grid choices in this process
only: a trial, not a setting of the engine.
"""

from __future__ import annotations

import sys


def _parse(spec: str) -> dict[int, dict]:
    """'64:BLOCK_N=256,num_warps=8;128:BLOCK_N=128' -> {64: {...}, 128: {...}}."""
    out: dict[int, dict] = {}
    for part in filter(None, spec.split(";")):
        dim, _, items = part.partition(":")
        out[int(dim)] = {k: int(v) for k, v in (item.split("=") for item in filter(None, items.split(",")))}
    return out


def _patch(per_dim: dict[int, dict]) -> None:
    import kernels.decode_attention as decode

    tile_config, splits, early = decode._tile_config, decode.choose_num_splits, decode.reads_first_tile_early
    chosen_dim: list[int] = []

    def patched_tiles(head_dim, dtype, tiles):
        chosen_dim[:] = [head_dim]
        if head_dim in per_dim and tiles is None:
            return tile_config(head_dim, dtype, dict(num_stages=1, **per_dim[head_dim]))
        return tile_config(head_dim, dtype, tiles)

    def patched_splits(num_seqs, num_kv_heads, device, *args):
        return 1 if _current_dim(chosen_dim) in per_dim else splits(num_seqs, num_kv_heads, device, *args)

    def patched_early(num_seqs, num_kv_heads, num_splits, device):
        return True if _current_dim(chosen_dim) in per_dim else early(num_seqs, num_kv_heads, num_splits, device)

    decode._tile_config = patched_tiles
    decode.choose_num_splits = patched_splits
    decode.reads_first_tile_early = patched_early
    _wrap_dim(decode, chosen_dim)


def _current_dim(chosen_dim: list[int]) -> int:
    return chosen_dim[0] if chosen_dim else -1


def _wrap_dim(decode, chosen_dim: list[int]) -> None:
    """paged_decode_attention picks its splits before its tiles: note q's head dim on entry."""
    original = decode.paged_decode_attention

    def wrapped(q, *args, **kwargs):
        chosen_dim[:] = [q.shape[-1]]
        return original(q, *args, **kwargs)

    decode.paged_decode_attention = wrapped


def main(argv: list[str]) -> None:
    spec = ""
    if "--single-pass" in argv:
        i = argv.index("--single-pass")
        spec = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if spec:
        _patch(_parse(spec))
    from bench.decode_latency import main as decode_main

    decode_main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
