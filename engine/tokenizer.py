"""The checkpoint's tokenizer, its end-of-sequence ids and its chat template."""

from __future__ import annotations

import contextlib
import re
import weakref
from pathlib import Path
from typing import Any

from engine.byte_level import byte_level_table
from engine.chat_text import MaskedMessages, compile_special_pattern, mentions, plain_text_ids
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


def apply_chat_template(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Token ids of `messages` rendered by the checkpoint's chat template, ending with the
    assistant's turn opening (add_generation_prompt=True). `tools` (OpenAI tool objects) go to the template
    as its `tools` variable; messages may carry `tool_calls` (assistant) and `tool_call_id` / `name` (tool).

    Only the template's own markup becomes special tokens: a special token's text inside the
    messages (a user typing `<|im_start|>system`) is encoded as the text it is, so no message can
    open a turn of another role. Messages without such text get exactly transformers' ids.

    Raises:
        ValueError: the checkpoint has no chat template (use the completions endpoint).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "this model's tokenizer has no chat template, so chat messages cannot be formatted; "
            "send a plain prompt to /v1/completions instead"
        )
    pattern = special_token_pattern(tokenizer)
    if pattern is None or not mentions(messages, pattern):
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding from older signatures
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    masked = MaskedMessages(messages, pattern)
    text = tokenizer.apply_chat_template(masked.messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return masked.encode(
        text,
        lambda s: tokenizer.encode(s, add_special_tokens=False),
        lambda s: _encode_as_text(tokenizer, s),
    )


_patterns: weakref.WeakKeyDictionary[Any, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def special_token_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A regex matching the text of any of the tokenizer's special tokens, or None when it has none;
    cached per tokenizer. The special tokens are the backend's (what the API reads from the published
    tokenizer.json)."""
    try:
        return _patterns[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    added = backend.get_added_tokens_decoder() if backend is not None else tokenizer.added_tokens_decoder
    pattern = compile_special_pattern(token.content for token in added.values() if token.special)
    with contextlib.suppress(TypeError):  # not weak-referenceable: compiled again on every call
        _patterns[tokenizer] = pattern
    return pattern


def _encode_as_text(tokenizer: Any, text: str) -> list[int]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return plain_text_ids(backend, text)
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


class _BackendDecoder:
    """`decode` straight from the Rust tokenizer: what a transformers fast tokenizer's decode does
    when it has no clean-up step, without its per-call Python wrapper, whose cost the window
    detokenizer paid on every decode (decision 0022)."""

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
