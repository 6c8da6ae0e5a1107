"""The engine's torch dequantizers (engine/weights/gguf_quants.py) against the `gguf` package's numpy
dequantize, on random blocks of every supported type (random bytes, with finite fp16 scales), and on every
tensor of the packaged Gemma 3 270M GGUF but its embedding (Q4_K, Q5_0, Q6_K, Q8_0, F32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from engine.weights.gguf_quants import BLOCK_BYTES, SUPPORTED_TYPES, dequantize

# byte offsets of each type's fp16 fields (random bytes there could be NaN or inf)
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,)}  # fmt: skip


def random_blocks(type_name: str, num_blocks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(num_blocks, BLOCK_BYTES[type_name]), dtype=np.uint8)
    for offset in F16_FIELDS[type_name]:
        scales = rng.standard_normal(num_blocks).astype(np.float16) * np.float16(0.05)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(num_blocks, 2)
    return blocks


@pytest.mark.parametrize("type_name", sorted(BLOCK_BYTES))
def test_quantized_types_match_the_gguf_package(type_name: str) -> None:
    per_block = 256 if type_name.endswith("_K") else 32
    blocks = random_blocks(type_name, 24, seed=len(type_name))
    shape = (6, 4 * per_block)
    expected = gguf_dequantize(blocks.reshape(6, -1), GGMLQuantizationType[type_name]).reshape(shape)
    got = dequantize(blocks, type_name, shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == shape
    torch.testing.assert_close(got, torch.from_numpy(np.asarray(expected, dtype=np.float32)), atol=0, rtol=0)


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_float_types_match_the_gguf_package(type_name: str) -> None:
    values = torch.randn(3, 40)
    dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
    raw = values.to(dtype).view(torch.uint8 if dtype != torch.float32 else torch.uint8).numpy()
    got = dequantize(raw, type_name, (3, 40))
    torch.testing.assert_close(got, values.to(dtype).float(), atol=0, rtol=0)
    if type_name != "BF16":  # the package's dequantize takes typed arrays for F16 / F32
        typed = values.to(dtype).numpy()
        expected = gguf_dequantize(typed, GGMLQuantizationType[type_name])
        torch.testing.assert_close(got, torch.from_numpy(np.asarray(expected, np.float32)).reshape(3, 40))


def test_wrong_sizes_and_types_are_refused() -> None:
    with pytest.raises(ValueError, match="does not hold"):
        dequantize(random_blocks("Q8_0", 3, 0), "Q8_0", (4, 32))
    with pytest.raises(NotImplementedError, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), "IQ2_XXS", (256,))
    assert "Q4_K" in SUPPORTED_TYPES and "Q6_K" in SUPPORTED_TYPES


def test_every_tensor_of_the_packaged_gemma3_matches(gemma3_270m_gguf) -> None:
    reader = GGUFReader(gemma3_270m_gguf)
    seen = set()
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            continue  # 168M Q8_0 values: the package's numpy dequantize alone takes most of a minute on 2 cores
        name = tensor.tensor_type.name
        seen.add(name)
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        expected = np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)
        got = dequantize(tensor.data, name, shape)
        assert torch.equal(got, torch.from_numpy(expected)), tensor.name
    assert {"Q4_K", "Q6_K", "Q8_0", "Q5_0", "F32"} <= seen
