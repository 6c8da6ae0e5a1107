"""The KV memory one long sequence holds in a sliding-window model, against a full-attention model of the same
size, and against a pool that kept only what each layer can still see (CPU, no GPU, no weights).

    python -m bench.window_kv_memory                       # Gemma-3-1B and Gemma-3-4B shapes, 4k to 128k tokens
    python -m bench.window_kv_memory --models Gemma-3-1B --lengths 32768

For each model (bench/configs/<name>/config.json) and length N within its positions, a request of N tokens is
allocated (in 8,192-token chunks) through the engine's BlockManager in blocks of --block-size tokens, and the
rows report:
- inferq: the blocks the block manager holds for it, times the bytes of a block over all layers (one pool: a
  block holds a position's K/V of every layer, so the sliding layers' slots before their window stay held);
- full attention: the same model without windows (the same count: the pool is shared);
- per-group pool: what a pool per layer kind would hold (vLLM's hybrid allocator): every block for the global
  layers, for the sliding layers only the blocks that can hold the last W positions (ceil(W / B) + 1).
docs/decisions/0052-sliding-window-attention.md records why inferq keeps one pool. Writes
window_kv_memory.{json,md} into --out (default $OUT, else bench/results/<gpu>/).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.engine_common import CONFIGS
from bench.report import OUT_HELP, results_folder, table

MODELS = ("Gemma-3-1B", "Gemma-3-4B")
LENGTHS = (4096, 32768, 131072)
CHUNK = 8192
STEM = "window_kv_memory"


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--block-size", type=int, default=None, help="tokens per block (default: the engine's)")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    return parser.parse_args(argv)


def layer_windows(name: str) -> tuple[list[int | None], int, int, int]:
    """(window of each layer or None, Hkv, D, max positions) of bench/configs/<name>, as the engine reads them."""
    from transformers import AutoConfig

    from engine.model_loader import checkpoint_max_len, language_config
    from engine.models.llama import head_dim_of, num_kv_heads_of, sliding_window_of

    config = language_config(AutoConfig.from_pretrained(str(CONFIGS / name)))
    windows = [sliding_window_of(config, i) for i in range(config.num_hidden_layers)]
    return windows, num_kv_heads_of(config), head_dim_of(config), checkpoint_max_len(config)


def blocks_held(length: int, block_size: int) -> int:
    """Blocks the engine's BlockManager holds for one request of `length` tokens (prefill chunks, then decode)."""
    from engine.block_manager import BlockManager
    from engine.request import Request
    from engine.sampling_params import SamplingParams

    manager = BlockManager(num_blocks=-(-length // block_size) + 1, block_size=block_size)
    request = Request("r", list(range(length)), SamplingParams(max_tokens=1))
    while request.num_computed_tokens < length:
        step = min(CHUNK, length - request.num_computed_tokens)
        if not manager.allocate_slots(request, step):
            raise RuntimeError(f"{length} tokens do not fit the pool")
        request.num_computed_tokens += step
    return len(manager.get_block_ids("r"))


def measure(name: str, length: int, block_size: int, elem: int = 2) -> dict | None:
    """One row, or None where the model's positions stop short of `length`."""
    windows, num_kv_heads, head_dim, max_len = layer_windows(name)
    if length > max_len:
        return None
    blocks = blocks_held(length, block_size)
    layer_block_bytes = 2 * block_size * num_kv_heads * head_dim * elem  # K and V of one layer, one block
    per_group = sum(blocks if w is None else min(blocks, -(-w // block_size) + 1) for w in windows)
    gib = layer_block_bytes / 2**30
    return {
        "model": name,
        "tokens": length,
        "layers": len(windows),
        "sliding_layers": sum(w is not None for w in windows),
        "window": max((w for w in windows if w), default=None),
        "blocks": blocks,
        "inferq_gib": blocks * len(windows) * gib,
        "full_attention_gib": blocks * len(windows) * gib,
        "per_group_pool_gib": per_group * gib,
        "per_group_share": per_group / (blocks * len(windows)),
    }


def _markdown(rows: list[dict], block_size: int) -> str:
    return "\n".join([
        "# KV memory of one long sequence: sliding-window layers in one pool", "",
        f"bf16 K/V, blocks of {block_size} tokens, allocated through engine/block_manager.py; "
        "per-group pool: what a pool per layer kind would hold.", "",
        table(rows, [("model", "model", ""), ("tokens", "tokens", ""), ("layers", "layers", ""),
                     ("sliding_layers", "sliding", ""), ("window", "window", ""), ("blocks", "blocks", ""),
                     ("inferq_gib", "inferq GiB", ".3f"), ("full_attention_gib", "full attention GiB", ".3f"),
                     ("per_group_pool_gib", "per-group pool GiB", ".3f"), ("per_group_share", "its share", ".0%")]),
        "",
    ])  # fmt: skip


def main(argv=None) -> dict:
    from engine.config import CacheConfig

    args = _parse_args(argv)
    block_size = args.block_size or CacheConfig.block_size
    rows = [measure(name, int(n), block_size) for name in args.models.split(",") for n in args.lengths.split(",")]
    rows = [row for row in rows if row is not None]
    result = {"block_size": block_size, "rows": rows}
    out = results_folder(args.out, dry_run=False)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{STEM}.md").write_text(_markdown(rows, block_size))
    print(_markdown(rows, block_size))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
