"""The checkpoint's tokenizer, its end-of-sequence ids and its chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.byte_level import byte_level_table
from engine.weights.errors import CheckpointError


def load_tokenizer(model_dir: str | Path) -> Any:
    """The checkpoint directory's tokenizer (transformers AutoTokenizer, never online).

    Raises:
        CheckpointError: the directory has no usable tokenizer files.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError and others
        raise CheckpointError(f"cannot load a tokenizer from {model_dir}: {exc}") from exc


def load_generation_config(model_dir: str | Path) -> Any | None:
    """The checkpoint's generation_config.json as a GenerationConfig, or None when absent."""
    from transformers import GenerationConfig

    if not (Path(model_dir) / "generation_config.json").is_file():
        return None
    try:
        return GenerationConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # a malformed file
        raise CheckpointError(f"cannot read {Path(model_dir) / 'generation_config.json'}: {exc}") from exc


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value if v is not None}


def eos_token_ids(hf_config: Any, generation_config: Any | None, tokenizer: Any) -> set[int]:
    """Every id that ends generation: the union of config.json's, generation_config.json's
    (Llama 3 Instruct lists <|eot_id|> only there) and the tokenizer's eos_token_id."""
    ids = _ids(getattr(hf_config, "eos_token_id", None))
    if generation_config is not None:
        ids |= _ids(getattr(generation_config, "eos_token_id", None))
    ids |= _ids(getattr(tokenizer, "eos_token_id", None))
    return ids


def apply_chat_template(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of `messages` rendered by the checkpoint's chat template, ending with the
    assistant's turn opening (add_generation_prompt=True).

    Raises:
        ValueError: the checkpoint has no chat template (use the completions endpoint).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "this model's tokenizer has no chat template, so chat messages cannot be formatted; "
            "send a plain prompt to /v1/completions instead"
        )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding from older signatures
        ids = ids["input_ids"]
    return [int(i) for i in ids]


class _BackendDecoder:
    """`decode` straight from the Rust tokenizer: what a transformers fast tokenizer's decode does
    when it has no clean-up step, without its per-call Python wrapper (measured: the engine's
    detokenizers took 10 ms of host time per step at 256 sequences through tokenizer.decode,
    3.6 ms through this)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(token_ids, skip_special_tokens=skip_special_tokens)


def fast_decoder(tokenizer: Any) -> Any:
    """What the engine's detokenizers decode with (engine/detokenizer.py's make_detokenizer): a
    ByteLevelTable for byte-level BPE, else a _BackendDecoder, else the tokenizer itself; each only
    where it gives the tokenizer's own text."""
    table = byte_level_table(tokenizer)
    if table is not None:
        return table
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep its decode
        return tokenizer
    same_decode = (
        isinstance(tokenizer, TokenizersBackend)
        and type(tokenizer).decode is PreTrainedTokenizerBase.decode
        and type(tokenizer)._decode is TokenizersBackend._decode
        and not tokenizer.clean_up_tokenization_spaces
    )
    return _BackendDecoder(tokenizer._tokenizer) if same_decode else tokenizer
