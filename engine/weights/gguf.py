"""Converting a llama.cpp GGUF file, once, into a Hugging Face checkpoint directory.

The directory holds config.json (a LlamaConfig from the GGUF metadata),
model.safetensors (tensors dequantized to fp16, or fp32; 1-D tensors stay fp32),
the tokenizer and chat template (through transformers' GGUF tokenizer reader) and
generation_config.json (special token ids, and for the packaged model its recommended sampling:
engine/weights/default_model.py); the engine then loads it like any checkpoint.

The result lives under `cache_dir/<file stem>-<hash>`, the hash covering the file's
path, size and mtime, the storage dtype and the converter version. It is written in
a temporary sibling directory and renamed into place, so a directory that exists is
complete, and concurrent converters race harmlessly (the loser discards its copy).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from engine.weights.default_model import packaged_generation_config
from engine.weights.errors import CheckpointError

CONVERTER_VERSION = 2  # 2: the packaged model's generation_config.json holds its sampling defaults
SHARD_BYTES = 2 << 30

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_VOCABULARY_FIELDS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
)
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "inferq" / "models"


def converted_dir_name(gguf_path: Path, dtype: torch.dtype) -> str:
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}|v{CONVERTER_VERSION}"
    return f"{gguf_path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def convert_gguf(
    gguf_path: str | Path, cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float16
) -> Path:
    """Directory of the converted checkpoint, converting on first use.

    Args:
        gguf_path: a llama.cpp GGUF file of a Llama-architecture model.
        cache_dir: where converted checkpoints live; None is ~/.cache/inferq/models
            (the edge reads any environment override and passes it here).
        dtype: storage dtype of dequantized matrices, torch.float16 or torch.float32.

    Raises:
        CheckpointError: a missing or unreadable file, or an architecture or tensor the
            converter does not know.
    """
    gguf_path = Path(gguf_path).expanduser()
    if not gguf_path.is_file():
        raise CheckpointError(f"GGUF file {gguf_path} does not exist")
    if dtype not in (torch.float16, torch.float32):
        raise ValueError(f"GGUF conversion dtype must be float16 or float32, got {dtype}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / converted_dir_name(gguf_path, dtype)
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        _write_checkpoint(gguf_path, tmp, dtype)
        _make_readable(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _make_readable(directory: Path) -> None:
    """mkdtemp creates a private directory; the cache is readable by all, like Hugging Face's."""
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def _write_checkpoint(gguf_path: Path, out_dir: Path, dtype: torch.dtype) -> None:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf_path)
    except Exception as exc:  # gguf raises ValueError, struct errors, numpy errors
        raise CheckpointError(f"cannot read GGUF file {gguf_path}: {exc}") from exc
    metadata = {name: _field_value(field) for name, field in reader.fields.items() if _is_small(name)}
    tensor_shapes = {tensor.name: [int(n) for n in reversed(tensor.shape.tolist())] for tensor in reader.tensors}
    config = _llama_config(metadata, tensor_shapes, gguf_path)
    config.save_pretrained(out_dir)
    # One bar over the whole one-off conversion, however small the file: a step per tensor, then
    # the tokenizer (which takes as long as the tensors of a small model).
    with tqdm(total=len(reader.tensors) + 1, desc=f"Converting {gguf_path.name}", unit="step") as bar:
        _write_tensors(reader, config, out_dir, dtype, gguf_path, bar)
        bar.set_postfix_str("tokenizer")
        _write_tokenizer(gguf_path, out_dir)
        bar.update(1)
    _write_generation_config(metadata, out_dir, packaged_generation_config(gguf_path))


def _is_small(name: str) -> bool:
    # The vocabulary arrays are read by the tokenizer converter, not here.
    return name not in _VOCABULARY_FIELDS


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # a field type this gguf version cannot render: not one we use
        return None


def _llama_config(metadata: dict[str, Any], tensor_shapes: dict[str, list[int]], gguf_path: Path) -> Any:
    from transformers import LlamaConfig

    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise CheckpointError(f"GGUF file {gguf_path} has architecture {arch!r}; only 'llama' is supported")
    if "rope_freqs.weight" in tensor_shapes:
        raise CheckpointError(f"GGUF file {gguf_path} uses per-frequency rope factors (rope_freqs), not supported")

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"llama.{key}")
        return default if value is None else value

    num_heads = int(get("attention.head_count"))
    hidden_size = int(get("embedding_length"))
    rope_scaling = None
    scaling_type = get("rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling_type != "none":
        raise CheckpointError(f"GGUF file {gguf_path} has rope scaling {scaling_type!r}; supported: none, linear")
    if "token_embd.weight" not in tensor_shapes:
        raise CheckpointError(f"GGUF file {gguf_path} has no token_embd.weight tensor")
    return LlamaConfig(
        vocab_size=tensor_shapes["token_embd.weight"][0],  # [V, H]
        hidden_size=hidden_size,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=int(get("attention.key_length", hidden_size // num_heads)),
        max_position_embeddings=int(get("context_length", 4096)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in tensor_shapes,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        architectures=["LlamaForCausalLM"],
    )


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"
    return None


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of attn_q / attn_k rows (as transformers' GGUF loader does).

    llama.cpp stores each head's rows interleaved (pairs x0 x_{D/2} x1 ...) for its rotary
    kernel; per head, view the rows as [D/2, 2] and swap back to [2, D/2].
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # [Hx, D/2, 2, ...]
    return w.swapaxes(2, 1).reshape(weight.shape)  # [Hx, 2, D/2, ...] -> [Hx*D, ...]


def _write_tensors(reader: Any, config: Any, out_dir: Path, dtype: torch.dtype, gguf_path: Path, bar: tqdm) -> None:
    from gguf.quants import dequantize

    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0
    shard_files: list[tuple[Path, list[str]]] = []

    def flush() -> None:
        nonlocal shard, shard_bytes
        path = out_dir / f"shard-{len(shard_files):05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        shard_files.append((path, list(shard)))
        shard, shard_bytes = {}, 0

    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            raise CheckpointError(f"GGUF file {gguf_path} has tensor {tensor.name!r} with no Llama equivalent")
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
        # NOTE: np.array copies: the reader's arrays are read-only views of the memory-mapped file.
        array = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        if ".self_attn.q_proj." in name:
            array = unpermute_rotary_rows(array, config.num_attention_heads)
        elif ".self_attn.k_proj." in name:
            array = unpermute_rotary_rows(array, config.num_key_value_heads)
        value = torch.from_numpy(np.ascontiguousarray(array))  # [out, in] like nn.Linear
        shard[name] = value if value.dim() == 1 else value.to(dtype)
        shard_bytes += shard[name].nbytes
        if shard_bytes >= SHARD_BYTES:
            flush()
        bar.update(1)
    if shard:
        flush()
    _name_shards(shard_files, out_dir)


def _name_shards(shard_files: list[tuple[Path, list[str]]], out_dir: Path) -> None:
    """Rename the shards to the Hugging Face names, with an index when there are several."""
    if len(shard_files) == 1:
        shard_files[0][0].rename(out_dir / "model.safetensors")
        return
    weight_map = {}
    for i, (path, names) in enumerate(shard_files):
        final = f"model-{i + 1:05d}-of-{len(shard_files):05d}.safetensors"
        path.rename(out_dir / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:  # transformers' GGUF tokenizer reader raises many types
        raise CheckpointError(f"cannot build a tokenizer from GGUF file {gguf_path}: {exc}") from exc
    tokenizer.save_pretrained(str(out_dir))


def _write_generation_config(metadata: dict[str, Any], out_dir: Path, sampling: dict[str, Any]) -> None:
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        **({"do_sample": True, **sampling} if sampling else {}),
    ).save_pretrained(str(out_dir))
