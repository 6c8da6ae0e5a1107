"""Fetching a checkpoint from the Hugging Face Hub (or its local cache)."""

from __future__ import annotations

import re
from pathlib import Path

from engine.weights.errors import CheckpointError

# What a serving checkpoint needs: config, weights, tokenizer, chat template.
CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model", "*.tiktoken"]
CONFIG_PATTERNS = ["*.json", "*.jinja", "tokenizer*", "*.txt", "*.model", "*.tiktoken"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def looks_like_hub_id(model: str) -> bool:
    """'org/name' or 'name': no path separators beyond the one slash, no leading dot or tilde."""
    return bool(_HUB_ID.fullmatch(model)) and ".." not in model


def download_checkpoint(model_id: str, revision: str | None = None, *, weights: bool = True) -> Path:
    """Local directory of `model_id`'s snapshot, downloading what the local cache lacks.

    Args:
        model_id: a Hub repository id such as "Qwen/Qwen3-0.6B".
        revision: branch, tag or commit; None is the default branch.
        weights: False fetches config and tokenizer only (dummy weights).

    Raises:
        CheckpointError: the Hub cannot be reached (offline) and nothing is cached, or the
            id or revision does not exist; the message names the id.
    """
    from huggingface_hub import snapshot_download  # imported here: only Hub ids need it

    patterns = CHECKPOINT_PATTERNS if weights else CONFIG_PATTERNS
    try:
        return Path(snapshot_download(model_id, revision=revision, allow_patterns=patterns))
    except Exception as exc:  # huggingface_hub raises many types (HTTP, offline, not found)
        where = f"{model_id!r}" + (f" at revision {revision!r}" if revision else "")
        raise CheckpointError(
            f"cannot get model {where} from the Hugging Face Hub and it is not in the local cache: {exc}. "
            "Pass a local checkpoint directory or a .gguf file, or check the id, the network and HF_TOKEN."
        ) from exc
