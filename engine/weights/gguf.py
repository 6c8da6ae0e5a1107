"""Converting a llama.cpp GGUF file, once, into a Hugging Face checkpoint directory.

The directory holds config.json (a LlamaConfig or Gemma3TextConfig from the GGUF metadata: architectures
"llama" and "gemma3"), model.safetensors (tensors dequantized by engine/weights/gguf_quants.py to fp16, or
fp32; 1-D tensors stay fp32), the tokenizer and chat template (through transformers' GGUF tokenizer reader;
Gemma 3's own template where the file carries none) and generation_config.json (special token ids, and for
the packaged models their recommended sampling: engine/weights/packaged_models.py); the engine then loads it
like any checkpoint.

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

from engine.weights.errors import CheckpointError
from engine.weights.gguf_chat_templates import GEMMA3_CHAT_TEMPLATE
from engine.weights.gguf_quants import SUPPORTED_TYPES
from engine.weights.gguf_quants import dequantize as dequantize_tensor
from engine.weights.packaged_models import packaged_generation_config

# 2: the packaged model's generation_config.json holds its sampling defaults; 3: gemma3, torch dequantizers
CONVERTER_VERSION = 3
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
# Gemma 3 (llama.cpp's names): four norms a layer and per-head q / k norms
_GEMMA3_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_NAMES = {"llama": _BLOCK_NAMES, "gemma3": _GEMMA3_BLOCK_NAMES}
# llama.cpp's Gemma 3: the local RoPE base and the sliding-window pattern it fixes in code (not in the file)
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6
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
        gguf_path: a llama.cpp GGUF file of a Llama or Gemma 3 model.
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
    arch = metadata.get("general.architecture")
    if arch == "llama":
        config = _llama_config(metadata, tensor_shapes, gguf_path)
    elif arch == "gemma3":
        config = _gemma3_config(metadata, tensor_shapes, gguf_path)
    else:
        raise CheckpointError(f"GGUF file {gguf_path} has architecture {arch!r}; supported: {sorted(BLOCK_NAMES)}")
    config.save_pretrained(out_dir)
    # One bar over the whole one-off conversion, however small the file: a step per tensor, then
    # the tokenizer (which takes as long as the tensors of a small model).
    with tqdm(total=len(reader.tensors) + 1, desc=f"Converting {gguf_path.name}", unit="step") as bar:
        _write_tensors(reader, arch, config, out_dir, dtype, gguf_path, bar)
        bar.set_postfix_str("tokenizer")
        end_of_turn = _write_tokenizer(gguf_path, out_dir, arch)
        bar.update(1)
    _write_generation_config(metadata, out_dir, packaged_generation_config(gguf_path), end_of_turn)


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


def _gemma3_config(metadata: dict[str, Any], tensor_shapes: dict[str, list[int]], gguf_path: Path) -> Any:
    from transformers import Gemma3TextConfig

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"gemma3.{key}")
        return default if value is None else value

    num_heads = int(get("attention.head_count"))
    hidden_size = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden_size // num_heads))
    global_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 1_000_000.0))}
    scaling_type, factor = get("rope.scaling.type", "none"), float(get("rope.scaling.factor", 1.0))
    if scaling_type == "linear" or (scaling_type == "none" and factor != 1.0):
        global_rope.update(rope_type="linear", factor=factor)
    elif scaling_type != "none":
        raise CheckpointError(f"GGUF file {gguf_path} has rope scaling {scaling_type!r}; supported: none, linear")
    if "token_embd.weight" not in tensor_shapes:
        raise CheckpointError(f"GGUF file {gguf_path} has no token_embd.weight tensor")
    num_layers = int(get("block_count"))
    return Gemma3TextConfig(
        vocab_size=tensor_shapes["token_embd.weight"][0],
        hidden_size=hidden_size,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        # llama.cpp's scale is 1 / sqrt(head_dim) for every Gemma 3 but the 27B (hidden / heads)
        query_pre_attn_scalar=head_dim if num_layers != 62 else hidden_size // num_heads,
        max_position_embeddings=int(get("context_length", 32768)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        sliding_window=int(get("attention.sliding_window", 4096)),
        sliding_window_pattern=GEMMA3_SLIDING_WINDOW_PATTERN,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_BASE},
            "full_attention": global_rope,
        },  # fmt: skip
        tie_word_embeddings="output.weight" not in tensor_shapes,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        architectures=["Gemma3ForCausalLM"],
    )


def _hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    block_names = BLOCK_NAMES[arch]
    if match and match.group(2) in block_names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{block_names[part]}.{kind}"
    return None


def dequantize_gguf_tensor(tensor: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A reader tensor as float32 [shape]: engine/weights/gguf_quants.py's torch dequantizers for the types they
    cover, the gguf package's numpy ones for the rest."""
    type_name = tensor.tensor_type.name
    if type_name in SUPPORTED_TYPES:
        return dequantize_tensor(tensor.data, type_name, shape).numpy()
    from gguf.quants import dequantize

    # NOTE: np.array copies: the reader's arrays are read-only views of the memory-mapped file.
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of attn_q / attn_k rows (as transformers' GGUF loader does).

    llama.cpp stores each head's rows interleaved (pairs x0 x_{D/2} x1 ...) for its rotary
    kernel; per head, view the rows as [D/2, 2] and swap back to [2, D/2].
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # [Hx, D/2, 2, ...]
    return w.swapaxes(2, 1).reshape(weight.shape)  # [Hx, 2, D/2, ...] -> [Hx*D, ...]


def _write_tensors(
    reader: Any, arch: str, config: Any, out_dir: Path, dtype: torch.dtype, gguf_path: Path, bar: tqdm
) -> None:
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
        name = _hf_name(tensor.name, arch)
        if name is None:
            raise CheckpointError(f"GGUF file {gguf_path} has tensor {tensor.name!r} with no {arch} equivalent")
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
        array = dequantize_gguf_tensor(tensor, shape)
        if arch == "llama" and ".self_attn.q_proj." in name:
            array = unpermute_rotary_rows(array, config.num_attention_heads)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            array = unpermute_rotary_rows(array, config.num_key_value_heads)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            # NOTE: llama.cpp's converter stores Gemma's RMSNorm weights as 1 + w (its norm is x * w);
            # the checkpoint holds w, as transformers' Gemma3RMSNorm (x * (1 + w)) reads it
            array = array - 1.0
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


def _write_tokenizer(gguf_path: Path, out_dir: Path, arch: str) -> int | None:
    """Writes the tokenizer and chat template; returns the id of Gemma's <end_of_turn> (which ends a chat turn
    beside <eos>), None for Llama."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:  # transformers' GGUF tokenizer reader raises many types
        raise CheckpointError(f"cannot build a tokenizer from GGUF file {gguf_path}: {exc}") from exc
    end_of_turn = None
    if arch == "gemma3":
        if not tokenizer.chat_template:  # pretrained (not instruction-tuned) files carry none
            tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
        end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
        end_of_turn = end_of_turn if end_of_turn != tokenizer.unk_token_id else None
    tokenizer.save_pretrained(str(out_dir))
    return end_of_turn


def _write_generation_config(
    metadata: dict[str, Any], out_dir: Path, sampling: dict[str, Any], end_of_turn: int | None = None
) -> None:
    from transformers import GenerationConfig

    eos = metadata.get("tokenizer.ggml.eos_token_id")
    if end_of_turn is not None and eos is not None and end_of_turn != eos:
        eos = [eos, end_of_turn]
    GenerationConfig(
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos,
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        **({"do_sample": True, **sampling} if sampling else {}),
    ).save_pretrained(str(out_dir))
