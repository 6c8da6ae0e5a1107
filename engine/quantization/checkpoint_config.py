"""config.json's `quantization_config`: which packed format the checkpoint's linear layers use.

Accepted (each error names the field and what is supported):
    quant_method "fp8"                 float8_e4m3fn weights with `weight_scale_inv` in 128x128 blocks
                                       (`weight_block_size` [128, 128], Qwen/DeepSeek style), or per tensor
                                       (`weight_scale`) without a block size; `activation_scheme` dynamic,
                                       or static with an `input_scale` per layer
    quant_method "awq"                 `version` gemm, `bits` 4, `zero_point` true, `group_size` 32/64/128/-1
    quant_method "gptq"                `bits` 4 or 8, `group_size` 32/64/128/-1, `desc_act` false, `sym`;
                                       `checkpoint_format` gptq (zeros stored minus one) or gptq_v2
    quant_method "compressed-tensors"  one config group over the Linear layers: `format` pack-quantized
                                       (int weights, 4 or 8 bits, group or channel, symmetric or not at 4
                                       bits), int-quantized (int8 weights), or float-quantized (fp8 weights
                                       per tensor or channel, activations dynamic per token or static
                                       per tensor); `ignore` may name only the LM head
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.quantization.scheme import QuantScheme

METHODS = ("fp8", "awq", "gptq", "compressed-tensors")
GROUP_SIZES = (32, 64, 128, -1)
FIELD = "quantization_config"


class QuantizationConfigError(ValueError):
    """A quantization_config the engine cannot load; the message names the field."""


@dataclass(frozen=True)
class CheckpointQuantization:
    """Args:
    method: the quant_method.
    scheme: the in-memory layout its layers load into.
    bits: the packed codes' width (4 or 8; 8 for fp8).
    packing: the compressed-tensors format ("pack-quantized", "int-quantized", "float-quantized"), or the
        method for the others.
    gptq_zero_offset: GPTQ's zero points are stored minus one (checkpoint_format "gptq").
    """

    method: str
    scheme: QuantScheme
    bits: int
    packing: str
    gptq_zero_offset: bool = False


def _fail(field: str, value: Any, supported: str) -> QuantizationConfigError:
    return QuantizationConfigError(f"{FIELD}.{field}: {value!r} is not supported ({supported})")


def _group(field: str, value: Any) -> int | None:
    if value not in GROUP_SIZES:
        raise _fail(field, value, "32, 64, 128 or -1 for one group per row")
    return None if value == -1 else int(value)


def parse_quantization_config(config: Any) -> CheckpointQuantization | None:
    """The checkpoint's quantization from the transformers config (its `quantization_config`), or None."""
    raw = getattr(config, "quantization_config", None)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raw = raw.to_dict() if hasattr(raw, "to_dict") else dict(vars(raw))
    method = raw.get("quant_method")
    if method == "fp8":
        return _fp8(raw)
    if method == "awq":
        return _awq(raw)
    if method == "gptq":
        return _gptq(raw)
    if method == "compressed-tensors":
        return _compressed_tensors(raw)
    raise _fail("quant_method", method, ", ".join(METHODS))


def _fp8(raw: dict) -> CheckpointQuantization:
    if raw.get("fmt", "e4m3") != "e4m3":
        raise _fail("fmt", raw.get("fmt"), "e4m3")
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _fail("activation_scheme", scheme, "dynamic or static")
    block = raw.get("weight_block_size")
    if block is not None and list(block) != [128, 128]:
        raise _fail("weight_block_size", block, "[128, 128]")
    if block is not None and scheme == "static":
        raise _fail("activation_scheme", scheme, "dynamic with weight_block_size")
    fp8 = QuantScheme(
        fmt="fp8", fp8_scales="block" if block else "channel", static_input=scheme == "static", source="fp8"
    )
    return CheckpointQuantization("fp8", fp8, 8, "fp8")


def _awq(raw: dict) -> CheckpointQuantization:
    version = str(raw.get("version", "gemm")).lower()
    if version != "gemm":
        raise _fail("version", raw.get("version"), "gemm")
    if raw.get("bits", raw.get("w_bit", 4)) != 4:
        raise _fail("bits", raw.get("bits", raw.get("w_bit")), "4")
    if not raw.get("zero_point", True):
        raise _fail("zero_point", raw.get("zero_point"), "true")
    group = _group("group_size", raw.get("group_size", raw.get("q_group_size", 128)))
    return CheckpointQuantization("awq", QuantScheme("int4", group, zeros=True, source="awq"), 4, "awq")


def _gptq(raw: dict) -> CheckpointQuantization:
    bits = raw.get("bits", 4)
    if bits not in (4, 8):
        raise _fail("bits", bits, "4 or 8")
    if raw.get("desc_act", False):
        raise _fail("desc_act", raw.get("desc_act"), "false: act-order checkpoints (g_idx) are not supported")
    fmt = raw.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise _fail("checkpoint_format", fmt, "gptq or gptq_v2")
    sym = bool(raw.get("sym", True))
    if bits == 8 and not sym:
        raise _fail("sym", raw.get("sym"), "true with bits 8")
    group = _group("group_size", raw.get("group_size", 128))
    scheme = QuantScheme("int4" if bits == 4 else "int8", group, zeros=not sym, source="gptq")
    return CheckpointQuantization("gptq", scheme, bits, "gptq", gptq_zero_offset=fmt == "gptq")


def _compressed_tensors(raw: dict) -> CheckpointQuantization:
    ignore = [name for name in raw.get("ignore") or [] if name not in ("lm_head", "re:.*lm_head")]
    if ignore:
        raise _fail("ignore", ignore, "only the LM head may stay unquantized")
    groups = raw.get("config_groups") or {}
    if len(groups) != 1:
        raise _fail("config_groups", sorted(groups), "exactly one group")
    ((name, group),) = groups.items()
    field = f"config_groups.{name}"
    targets = group.get("targets") or []
    if targets != ["Linear"]:
        raise _fail(f"{field}.targets", targets, '["Linear"]')
    packing = group.get("format") or raw.get("format")
    weights = group.get("weights") or {}
    activations = group.get("input_activations")
    if packing == "float-quantized":
        return _ct_float(weights, activations, field)
    if packing in ("pack-quantized", "int-quantized"):
        if activations is not None:
            raise _fail(f"{field}.input_activations", activations, "none: int weights are weight-only here")
        return _ct_int(weights, packing, field)
    raise _fail("format", packing, "pack-quantized, int-quantized or float-quantized")


def _ct_common(weights: dict, field: str, kind: str, bits: tuple[int, ...]) -> None:
    if weights.get("type") != kind:
        raise _fail(f"{field}.weights.type", weights.get("type"), kind)
    if weights.get("num_bits") not in bits:
        raise _fail(f"{field}.weights.num_bits", weights.get("num_bits"), " or ".join(map(str, bits)))
    # "weight" act-order reorders columns only while quantizing: the stored groups stay in order (no g_idx)
    if weights.get("actorder") not in (None, False, "weight"):
        raise _fail(f"{field}.weights.actorder", weights.get("actorder"), "null or weight: group act-order (g_idx)")
    if weights.get("dynamic"):
        raise _fail(f"{field}.weights.dynamic", weights.get("dynamic"), "false")


def _ct_int(weights: dict, packing: str, field: str) -> CheckpointQuantization:
    _ct_common(weights, field, "int", (4, 8) if packing == "pack-quantized" else (8,))
    bits = weights["num_bits"]
    strategy = weights.get("strategy")
    if strategy not in ("group", "channel"):
        raise _fail(f"{field}.weights.strategy", strategy, "group or channel")
    group = _group(f"{field}.weights.group_size", weights.get("group_size")) if strategy == "group" else None
    sym = bool(weights.get("symmetric", True))
    if bits == 8 and not sym:
        raise _fail(f"{field}.weights.symmetric", weights.get("symmetric"), "true with num_bits 8")
    scheme = QuantScheme("int4" if bits == 4 else "int8", group, zeros=not sym, source="compressed-tensors")
    return CheckpointQuantization("compressed-tensors", scheme, bits, packing)


def _ct_float(weights: dict, activations: dict | None, field: str) -> CheckpointQuantization:
    _ct_common(weights, field, "float", (8,))
    strategy = weights.get("strategy")
    if strategy not in ("tensor", "channel"):
        raise _fail(f"{field}.weights.strategy", strategy, "tensor or channel")
    if activations is None:
        raise _fail(f"{field}.input_activations", None, "fp8 activations: weight-only fp8 is not supported")
    if activations.get("type") != "float" or activations.get("num_bits") != 8:
        raise _fail(f"{field}.input_activations", activations, "type float, num_bits 8")
    dynamic = bool(activations.get("dynamic"))
    act_strategy = activations.get("strategy")
    if (dynamic and act_strategy != "token") or (not dynamic and act_strategy != "tensor"):
        raise _fail(f"{field}.input_activations.strategy", act_strategy, "token when dynamic, tensor when static")
    scheme = QuantScheme("fp8", fp8_scales="channel", static_input=not dynamic, source="compressed-tensors")
    return CheckpointQuantization("compressed-tensors", scheme, 8, "float-quantized")
