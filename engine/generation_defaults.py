"""The model's own sampling defaults, applied where a request is silent.

A checkpoint's generation_config.json holds its authors' recommended sampling (Llama 3.1:
temperature 0.6, top_p 0.9; Qwen2.5: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty
1.05). As vLLM does by default (`--generation-config auto`), a request's sampling parameters start
from these five fields, and `max_new_tokens`, when present, is the default max_tokens; a field the
request sets wins. Nothing else in the file is read (vLLM ignores `do_sample` too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import GENERATION_DEFAULTS_MODES
from engine.sampling_params import SamplingParams
from engine.weights.errors import CheckpointError

# generation_config.json field -> SamplingParams field
_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationDefaults:
    """SamplingParams field -> the model's default value (empty: SamplingParams' own defaults)."""

    values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, mode: str = "model") -> GenerationDefaults:
        """The defaults of a checkpoint directory.

        Args:
            model_dir: the checkpoint; its generation_config.json is read when present.
            mode: "model" applies the file's values; "none" ignores them (SamplingParams' defaults).

        Raises:
            CheckpointError: the file is not JSON, or holds a value SamplingParams refuses.
        """
        if mode not in GENERATION_DEFAULTS_MODES:
            raise ValueError(f"generation defaults must be one of {GENERATION_DEFAULTS_MODES}, got {mode!r}")
        path = Path(model_dir) / "generation_config.json"
        if mode == "none" or not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        values = {ours: raw[theirs] for theirs, ours in _FIELDS.items() if raw.get(theirs) is not None}
        try:
            SamplingParams(**values)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(
                f"{path} holds a sampling default the engine refuses: {exc} "
                "(start the worker with --generation-defaults none to ignore the file)"
            ) from exc
        return cls(values)

    @property
    def max_tokens(self) -> int | None:
        """The default max_tokens (the file's max_new_tokens), None when the model sets none."""
        return self.values.get("max_tokens")

    def sampling_params(self, params: Mapping[str, Any]) -> SamplingParams:
        """SamplingParams from a request's params: its fields over these defaults.

        Raises:
            ValueError, TypeError: a field out of range or unknown (SamplingParams' own checks).
        """
        return SamplingParams(**{**self.values, **params})

    def describe(self) -> str:
        if not self.values:
            return "none (SamplingParams' own defaults)"
        return ", ".join(f"{name}={value}" for name, value in self.values.items())
