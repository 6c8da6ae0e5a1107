"""Reading Hugging Face safetensors checkpoints: one file or shards with an index.

Only safetensors is read (no pytorch_model.bin: unpickling runs code).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from engine.weights.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Show a progress bar only where loading takes long enough to wonder.
PROGRESS_MIN_BYTES = 1 << 30


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in load order.

    Raises:
        CheckpointError: no safetensors file, an unreadable index, or a shard the index
            names that is not there.
    """
    model_dir = Path(model_dir)
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read checkpoint index {index_path}: {exc}") from exc
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    elif (model_dir / SINGLE_FILE).is_file():
        files = [model_dir / SINGLE_FILE]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise CheckpointError(
                f"no safetensors checkpoint in {model_dir} (expected {SINGLE_FILE} or {INDEX_FILE}; "
                "pytorch_model.bin is not supported)"
            )
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing (listed in {index_path})")
    return files


def iterate_weights(files: list[Path], show_progress: bool | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, CPU tensor) for every tensor of every file.

    Args:
        files: from `checkpoint_files`.
        show_progress: tqdm bar over bytes read; None shows it for more than one file or
            more than PROGRESS_MIN_BYTES in all.

    Raises:
        CheckpointError: a file that is not valid safetensors (truncated, corrupt), naming it.
    """
    total_bytes = sum(path.stat().st_size for path in files)
    if show_progress is None:
        show_progress = len(files) > 1 or total_bytes > PROGRESS_MIN_BYTES
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="Loading weights", disable=not show_progress) as bar:
        for path in files:
            yield from _read_file(path, bar)


def _read_file(path: Path, bar: tqdm) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as reader:
            names = list(reader.keys())
            for name in names:
                tensor = reader.get_tensor(name)
                bar.update(tensor.numel() * tensor.element_size())
                yield name, tensor
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own error types, OSError and others
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc
