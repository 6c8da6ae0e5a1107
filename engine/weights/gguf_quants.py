"""Dequantizing llama.cpp's GGUF tensor types to float32, in torch (whole tensors at once, one op per field).

Legend: n = blocks, 32 = weights of a block (256 = of a K-quant super-block), d / dmin = fp16 scales.

    F32, F16, BF16    as stored
    Q8_0   [d, q:int8 x 32]                             w = d q
    Q4_0   [d, nibbles x 16]                            w = d (q - 8)        (low nibbles: weights 0-15)
    Q4_1   [d, m, nibbles x 16]                         w = d q + m
    Q5_0   [d, high bits:u32, nibbles x 16]             w = d (q - 16)       (bit j of the u32: weight j's 5th)
    Q5_1   [d, m, high bits:u32, nibbles x 16]          w = d q + m
    Q4_K   [d, dmin, 12 scale bytes, nibbles x 128]     w = d sc_j q - dmin m_j, 8 sub-blocks j of 32
    Q5_K   [d, dmin, 12 scale bytes, high bits x 32, nibbles x 128]   as Q4_K with a 5th bit
    Q6_K   [low nibbles x 128, 2-bit highs x 64, scales:int8 x 16, d]  w = d sc_j (q - 32), 16 of 16
The layouts and the order of weights follow ggml-quants.c's dequantize_row_*; tests/engine/test_gguf_quants.py
holds each against the `gguf` package's numpy dequantize. Types not listed here fall back to that package.
"""

from __future__ import annotations

import numpy as np
import torch

QK = 32
QK_K = 256
# bytes of one block, by GGML type name
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
SUPPORTED_TYPES = ("F32", "F16", "BF16", *BLOCK_BYTES)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """[n, 1] float32 of the fp16 at byte `start` of each block."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 2, k]: the low nibbles, then the high nibbles."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=1)


def _bits(packed: torch.Tensor, count: int) -> torch.Tensor:
    """[n, k] bytes -> [n, count, k]: bit i of every byte in row i (i < count)."""
    shifts = torch.arange(count, dtype=torch.uint8).view(1, count, 1)
    return (packed.unsqueeze(1) >> shifts) & 1


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins, each [n, 8] float32."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc.float(), mn.float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * b[:, 2:].view(torch.int8).float()


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:]).reshape(-1, QK).float()
    return _f16(b, 0) * (q - 8)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:]).reshape(-1, QK).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q5(b: torch.Tensor, high_at: int) -> torch.Tensor:
    """The 5-bit weights of Q5_0 / Q5_1 as [n, 32] float32 (high bits: a little-endian u32 at high_at)."""
    high = _bits(b[:, high_at : high_at + 4], 8).permute(0, 2, 1).reshape(-1, QK)  # bit j of the u32: weight j
    low = _nibbles(b[:, high_at + 4 :]).reshape(-1, QK)
    return (low | (high << 4)).float()


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_q5(b, 2) - 16)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _q5(b, 4) + _f16(b, 2)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 32 bytes: sub-block 2c in the low nibbles, 2c + 1 high
    q = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(-1, 8, 32).float()
    return (_f16(b, 0)[:, :, None] * sc[:, :, None] * q - _f16(b, 2)[:, :, None] * mn[:, :, None]).reshape(-1, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    sc, mn = _k_scales(b[:, 4:16])
    high = _bits(b[:, 16:48], 8)  # [n, 8, 32]: bit j of byte l is weight l of sub-block j's 5th bit
    low = b[:, 48:].reshape(-1, 4, 32)
    low = torch.stack((low & 0x0F, low >> 4), dim=2).reshape(-1, 8, 32)  # sub-block 2c: low nibbles
    q = (low | (high << 4)).float()
    return (_f16(b, 0)[:, :, None] * sc[:, :, None] * q - _f16(b, 2)[:, :, None] * mn[:, :, None]).reshape(-1, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    ql = b[:, :128].reshape(-1, 2, 64)  # two halves of 128 weights
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    scales = b[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]
    low = torch.stack((ql & 0x0F, ql >> 4), dim=2).reshape(-1, 2, 4, 32)  # [n, half, quarter, 32]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    high = (qh >> shifts) & 0x03
    q = ((low | (high << 4)).to(torch.int16) - 32).float().reshape(-1, 16, 16)  # 16 groups of 16
    return (_f16(b, 208)[:, :, None] * scales[:, :, None] * q).reshape(-1, QK_K)


_DEQUANTIZE = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}  # fmt: skip


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A GGUF tensor's raw data (as the gguf reader exposes it) -> float32 tensor of `shape` (outermost dim
    first, the order torch and transformers use).

    Raises:
        NotImplementedError: a type outside SUPPORTED_TYPES (the caller falls back to the gguf package).
        ValueError: data whose size does not fit the type and shape.
    """
    numel = int(np.prod(shape)) if shape else 1
    # NOTE: np.array copies: the reader's arrays are read-only views of the memory-mapped file
    raw = torch.from_numpy(np.array(data).reshape(-1).view(np.uint8))
    if type_name in ("F32", "F16", "BF16"):
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
        values = raw.view(dtype)
        if values.numel() != numel:
            raise ValueError(f"{type_name} data holds {values.numel()} values for a tensor of {numel}")
        return values.float().reshape(shape)
    if type_name not in _DEQUANTIZE:
        raise NotImplementedError(f"GGUF type {type_name} has no torch dequantizer; supported: {SUPPORTED_TYPES}")
    block_bytes = BLOCK_BYTES[type_name]
    per_block = QK_K if type_name.endswith("_K") else QK
    if raw.numel() % block_bytes or raw.numel() // block_bytes * per_block != numel:
        raise ValueError(f"{type_name} data of {raw.numel()} bytes does not hold a tensor of {numel} values")
    return _DEQUANTIZE[type_name](raw.view(-1, block_bytes)).reshape(shape)
