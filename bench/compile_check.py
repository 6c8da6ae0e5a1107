"""Compiles every Triton kernel of kernels/ for an H100 (sm_90) on a machine without a GPU, and reports
each variant's registers and spills from its SASS.

    python -m bench.compile_check            # a table; exit status 1 if a variant fails to compile
    python -m bench.compile_check --sass DIR # also writes each variant's SASS into DIR

Why: the CPU interpreter runs Python, so code that Triton's compiler rejects passes every CPU test. A
return under a constexpr `if`, or a loop-carried name whose shape changes, passes there and fails only
on the GPU. One device call on 2026-11-24 was lost that way. The compiler, ptxas and nvdisasm ship in
the triton wheel, so none of this needs a GPU. Spills (local loads and stores in the SASS) are what a
kernel change most often costs without anyone noticing.

NOTE: run without TRITON_INTERPRET (the interpreter's kernels cannot be compiled). The tests run it in
a subprocess of its own. Each variant is one representative launch of the engine (bf16, the Llama-3
shapes' constexprs); the pointer and integer types follow the engine's tensors.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TARGET = ("cuda", 90, 32)  # H100: sm_90, warp size 32
# Pointer arguments that are not bf16 activations or weights, by name.
POINTER_TYPES = {
    "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32", "counter_ptr": "*i32",
    "order_ptr": "*i64",
    "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "part_max_ptr": "*fp32", "part_idx_ptr": "*i32",
    "part_bad_ptr": "*i32", "pos_ptr": "*i64", "slot_ptr": "*i64", "cache_ptr": "*fp32", "cos_sin_ptr": "*fp32",
    "params_ptr": "*fp64", "packed_ptr": "*i64", "work_ptr": "*fp32", "kth_ptr": "*fp32", "hist_ptr": "*i32",
    "select_ptr": "*i64",
    # the MoE kernels' routing tensors
    "ids_ptr": "*i32", "counts_ptr": "*i32", "sorted_ptr": "*i32", "offsets_ptr": "*i32", "starts_ptr": "*i32",
    "block_experts_ptr": "*i32", "num_padded_ptr": "*i32", "weights_ptr": "*fp32", "routed_ptr": "*fp32",
}  # fmt: skip
FLOAT_SCALARS = {"eps", "norm_eps", "qk_scale"}


@dataclass
class Variant:
    module: str
    kernel: str
    constexprs: dict
    options: dict = field(default_factory=lambda: {"num_warps": 4, "num_stages": 3})
    label: str = ""
    # Integer arguments that the representative launch passes as multiples of 16. Triton specializes
    # those at launch (vectorized loads where a mask compares against them), so the compile marks them
    # too: without it the one-token GEMV compiled to 2-byte loads and the KV store showed 16 spill
    # instructions that its launches do not have.
    multiples_of_16: tuple[str, ...] = ()
    # Pointer types of this variant beside POINTER_TYPES (the quantized GEMM's codes and activations).
    pointer_types: dict = field(default_factory=dict)


def _variants() -> list[Variant]:
    import triton.language as tl

    pdl = {"PDL": True}
    on = {"launch_pdl": True}
    decode = dict(HEAD_DIM=128, BLOCK_D=128, GROUP=4, BLOCK_G=16, BLOCK_GROUP=4, BLOCK_N=64, PAGE_SIZE=16,
                  BLOCK_P=64, P_CHUNK=8, DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", ORDERED=False,
                  LOOP_STAGES=3, PIPELINE_MIN_TILES=4, **pdl)  # fmt: skip
    norm_gemv = dict(HAS_RESIDUAL=True, HAS_BIAS=False, BLOCK_N=8, BLOCK_K=512, PREFETCH=False, **pdl)
    rows = dict(HAS_RESIDUAL=True, HAS_BIAS=False, **pdl)
    gemv_sizes, norm_gemv_sizes = ("N", "K"), ("num_rows", "K")  # every Llama / Qwen projection's
    rope = dict(HALF=64, BLOCK_HALF=64, BLOCK_H=32, BLOCK_T=1, **pdl)  # rope_tiles at 32 query heads, D = 128
    # the engine's 16-bit D = 128 tiles (kernels/prefill_attention.py's _tile_config): pointer gathers on
    # 16-token blocks, TMA boxes on 64-token blocks (the default pool)
    prefill_tma = dict(HEAD_DIM=128, BLOCK_D=128, GROUP=4, BLOCK_Q=32, BLOCK_M=128, PAGE_SIZE=64, BLOCK_N=64,
                       DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", USE_TMA=True)  # fmt: skip
    prefill = dict(prefill_tma, PAGE_SIZE=16, USE_TMA=False, k_desc=None, v_desc=None)  # no descriptors: constexpr None
    return [
        Variant("gemv", "_gemv_kernel", dict(HAS_BIAS=False, BLOCK_N=4, BLOCK_K=512, PREFETCH=False, **pdl),
                {"num_warps": 8, "num_stages": 1, **on}, multiples_of_16=gemv_sizes),
        Variant("gemv", "_gemv_kernel", dict(HAS_BIAS=False, BLOCK_N=4, BLOCK_K=1024, PREFETCH=True, **pdl),
                {"num_warps": 8, "num_stages": 1, **on}, "wide prefetch", gemv_sizes),
        Variant("gemv", "_gemv_kernel", dict(HAS_BIAS=True, BLOCK_N=4, BLOCK_K=512, PREFETCH=False, PDL=False),
                {"num_warps": 8, "num_stages": 1}, "bias, no PDL", gemv_sizes),
        Variant("rms_norm_gemv", "_rms_norm_gemv_kernel", dict(norm_gemv, SWIGLU=False), {"num_warps": 4, **on},
                multiples_of_16=norm_gemv_sizes),
        Variant("rms_norm_gemv", "_rms_norm_gemv_kernel", dict(norm_gemv, SWIGLU=True, BLOCK_N=4),
                {"num_warps": 2, **on}, "SwiGLU (the engine's 4 + 4 rows, 2 warps)", norm_gemv_sizes),
        Variant("rms_norm_gemv", "_rms_norm_gemv_kernel", dict(norm_gemv, SWIGLU=False, PREFETCH=True),
                {"num_warps": 4, **on}, "prefetch", norm_gemv_sizes),
        Variant("rms_norm_gemv", "_rms_norm_gemv_kernel", dict(norm_gemv, SWIGLU=True, PREFETCH=True),
                {"num_warps": 4, **on}, "SwiGLU, prefetch", norm_gemv_sizes),
        # a few token rows (kernels/gemv_rows.py's tiles: a verification step's 5 rows padded to 8, and 4 rows)
        Variant("gemv_rows", "_gemv_rows_kernel", dict(ROWS=8, HAS_BIAS=False, BLOCK_N=1, BLOCK_K=512, **pdl),
                {"num_warps": 4, "num_stages": 1, **on}, "8 rows", ("N", "K", "stride_xm", "stride_ym")),
        Variant("gemv_rows", "_rms_norm_gemv_rows_kernel", dict(rows, ROWS=4, BLOCK_N=2, BLOCK_K=256, SWIGLU=False),
                {"num_warps": 8, "num_stages": 1, **on}, "4 rows", ("num_rows", "K", "stride_xm", "stride_ym")),
        Variant("gemv_rows", "_rms_norm_gemv_rows_kernel", dict(rows, ROWS=4, BLOCK_N=4, BLOCK_K=128, SWIGLU=True),
                {"num_warps": 4, "num_stages": 1, **on}, "4 rows, SwiGLU", ("num_rows", "K", "stride_xm", "stride_ym")),
        Variant("rms_norm_qkv_rope", "_rms_norm_qkv_rope_kernel",
                dict(HALF=64, HAS_RESIDUAL=True, HAS_BIAS=False, BLOCK_N=4, BLOCK_K=512, **pdl),
                {"num_warps": 4, **on}, multiples_of_16=("K",)),
        Variant("rms_norm_qkv_rope", "_rms_norm_qkv_rope_kernel",
                dict(HALF=32, HAS_RESIDUAL=True, HAS_BIAS=False, BLOCK_N=2, BLOCK_K=1024, **pdl),
                {"num_warps": 4, **on}, "wide tile (1B)", multiples_of_16=("K",)),
        Variant("decode_attention", "_decode_kernel",
                dict(decode, NUM_SPLITS=33, MERGE_HERE=True, EARLY_FIRST_TILE=True),
                {"num_warps": 4, "num_stages": 1, **on}, "33 splits, early first tile"),
        Variant("decode_attention", "_decode_kernel", dict(decode, NUM_SPLITS=1, BLOCK_P=1, P_CHUNK=1,
                                                           MERGE_HERE=True, EARLY_FIRST_TILE=False),
                {"num_warps": 4, "num_stages": 1, **on},
                "1 split"),
        Variant("decode_attention", "_decode_kernel", dict(decode, NUM_SPLITS=1, BLOCK_P=1, P_CHUNK=1,
                                                           MERGE_HERE=False, EARLY_FIRST_TILE=False, ORDERED=True),
                {"num_warps": 4, "num_stages": 1, **on},
                "1 split, longest first"),
        Variant("decode_split_merge", "_merge_splits_kernel",
                dict(HEAD_DIM=64, BLOCK_D=64, NUM_SPLITS=33, BLOCK_P=64, P_CHUNK=64, **pdl), {"num_warps": 1, **on},
                "D = 64 (1B)"),
        Variant("decode_split_merge", "_merge_splits_kernel",
                dict(HEAD_DIM=128, BLOCK_D=128, NUM_SPLITS=33, BLOCK_P=64, P_CHUNK=32, **pdl), {"num_warps": 1, **on},
                "D = 128"),
        Variant("prefill_attention", "_prefill_kernel", dict(prefill, BLOCK_N=32), {"num_warps": 4, "num_stages": 4},
                "queries < 4k"),
        Variant("prefill_attention", "_prefill_kernel", dict(prefill, BLOCK_N=128), {"num_warps": 8, "num_stages": 3},
                "queries >= 4k"),
        Variant("prefill_attention", "_prefill_kernel", prefill_tma, {"num_warps": 4, "num_stages": 3},
                "64-token blocks, TMA"),
        Variant("top_k_select", "_radix_pass_kernel", dict(BLOCK_V=2048, DIGIT=1, **pdl), {"num_warps": 8, **on}),
        Variant("random_sample", "_race_kernel", dict(BLOCK_C=128, BLOCK_V=2048, HAS_KTH=True, **pdl),
                {"num_warps": 8, **on}),
        Variant("random_sample", "_check_kernel", dict(BLOCK_C=128, BLOCK_V=2048, HAS_KTH=True, **pdl),
                {"num_warps": 8, **on}),
        Variant("greedy_sample", "_greedy_kernel", dict(BLOCK_C=128, BLOCK_V=2048, **pdl), {"num_warps": 8, **on}),
        Variant("rms_norm", "_rms_norm_kernel", dict(HAS_RESIDUAL=True, BLOCK_R=1, BLOCK_N=4096, **pdl),
                {"num_warps": 8, **on}),
        Variant("layer_norm", "_layer_norm_kernel", dict(BLOCK_R=1, BLOCK_N=1024, **pdl), {"num_warps": 4, **on}),
        Variant("silu_and_mul", "_silu_and_mul_kernel", dict(BLOCK=2048, **pdl), {"num_warps": 8, **on}),
        Variant("gelu_tanh", "_gelu_tanh_kernel", dict(BLOCK=2048, **pdl), {"num_warps": 8, **on}),
        Variant("rope", "_rope_kernel", rope, {"num_warps": 4, **on}),
        Variant("rope_store_kv", "_rope_store_kv_kernel", dict(rope, BLOCK_HK=8, HAS_QK_NORM=True),
                {"num_warps": 4, **on}, "q/k norm"),
        Variant("rope_store_kv", "_rope_store_kv_kernel", dict(rope, BLOCK_H=16, BLOCK_HK=4, HAS_QK_NORM=False),
                {"num_warps": 4, **on}, "16 / 4 heads (a 2048-wide Llama)"),
        Variant("kv_store", "_store_kv_kernel", dict(BLOCK_T=8, BLOCK_H=8, BLOCK_D=128, **pdl), {"num_warps": 8, **on},
                multiples_of_16=("num_tokens", "head_dim", "block_size")),
        *_moe_variants(pdl, on),
        *_quant_variants(pdl, on),
    ]  # fmt: skip


def _moe_variants(pdl: dict, on: dict) -> list[Variant]:
    """The MoE kernels at the Qwen3-30B-A3B shape (E = 128, top-8, H = 2048, I = 768): the heuristic's tiles."""
    import triton.language as tl

    gemm = dict(DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32", **pdl)
    small = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1)
    large = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8)
    return [
        Variant("moe_router", "_moe_route_kernel", dict(TOP_K=8, BLOCK_K=8, RENORMALIZE=True, BLOCK_T=32,
                                                        BLOCK_E=128, **pdl), {"num_warps": 8, **on}, "E = 128, top-8"),
        Variant("moe_align", "_count_kernel", dict(CHUNK=64, BLOCK_E=128, FILL=1024, **pdl), {"num_warps": 8, **on}),
        Variant("moe_align", "_offsets_kernel", dict(BLOCK_M=16, BLOCK_C=64, BLOCK_E=128, BLOCK_B=64, **pdl),
                {"num_warps": 8, **on}),
        Variant("moe_align", "_scatter_kernel", dict(CHUNK=64, BLOCK_E=128, **pdl), {"num_warps": 8, **on}),
        Variant("moe_gemm", "_moe_gemm_kernel", dict(A_ROW_DIV=8, GATED=True, MUL_WEIGHT=False, **small, **gemm),
                {"num_warps": 4, "num_stages": 3, **on}, "gate|up, 16-row tiles", ("N", "Kr", "stride_a")),
        Variant("moe_gemm", "_moe_gemm_kernel", dict(A_ROW_DIV=8, GATED=True, MUL_WEIGHT=False, **large, **gemm),
                {"num_warps": 8, "num_stages": 3, **on}, "gate|up, 128-row tiles", ("N", "Kr", "stride_a")),
        Variant("moe_gemm", "_moe_gemm_kernel", dict(A_ROW_DIV=1, GATED=False, MUL_WEIGHT=True, **large, **gemm),
                {"num_warps": 8, "num_stages": 3, **on}, "down, 128-row tiles", ("N", "Kr", "stride_a")),
        Variant("moe_gemv", "_moe_gemv_gate_up_kernel", dict(TOP_K=8, BLOCK_N=4, BLOCK_K=512, UNROLL=True, CHUNKS=4,
                                                              **pdl),
                {"num_warps": 8, "num_stages": 1, **on}, multiples_of_16=("inter", "hidden")),
        Variant("moe_gemv", "_moe_gemv_down_kernel", dict(TOP_K=8, BLOCK_N=4, BLOCK_K=512, UNROLL=True, CHUNKS=2,
                                                           **pdl),
                {"num_warps": 8, "num_stages": 1, **on}, multiples_of_16=("inter", "hidden")),
    ]  # fmt: skip


def _quant_gemv_variants(pdl: dict, on: dict) -> list[Variant]:
    """The one-token quantized GEMV (kernels/quant_gemv.py) at its GPU tiles: codes as words (int4, int8, nf4)
    with bf16 x as pairs, fp8 codes one by one; K a multiple of the step (the Llama shapes)."""
    from kernels.quant_gemv import FP8, INT4, INT8, NF4, WHOLE_ROW, gemv_tiles

    words = {"w_ptr": "*i32", "x_ptr": "*i32"}
    fp8 = {"w_ptr": "*fp8e4nv", "x_ptr": "*fp8e4nv"}
    common = dict(W_ROW_DIV=1, HAS_ZEROS=False, X_SCALE=0, X_PAIRS=1, EVEN_K=True, **pdl)
    formats = {  # name: (FORMAT, constexprs, pointer types)
        "int4 g128 zeros": (INT4, dict(W_SCALE=1, HAS_ZEROS=True, PER=8, PACKED=True, SCALE_W=128), words),
        "int4 g128": (INT4, dict(W_SCALE=1, PER=8, PACKED=True, SCALE_W=128), words),
        "int8 per channel": (INT8, dict(W_SCALE=2, PER=4, PACKED=True, SCALE_W=WHOLE_ROW), words),
        "nf4": (NF4, dict(W_SCALE=1, PER=8, PACKED=True, SCALE_W=64), words),
        "fp8 blocks": (
            FP8,
            dict(W_SCALE=1, W_ROW_DIV=128, X_SCALE=1, X_PAIRS=0, PER=8, PACKED=False, SCALE_W=128),
            fp8,
        ),
        "fp8 per channel": (FP8, dict(W_SCALE=2, X_SCALE=2, X_PAIRS=0, PER=8, PACKED=False, SCALE_W=WHOLE_ROW), fp8),
    }
    scales = {"xs_ptr": "*fp32", "ws_ptr": "*fp32", "wz_ptr": "*u8", "codebook_ptr": "*fp32"}
    variants = []
    for name, (fmt, constexprs, pointers) in formats.items():
        # the tile of the Llama-3.1-8B gate|up projection (the grid's largest)
        tile = gemv_tiles(fmt, True, 28672, 4096, per_channel=name == "fp8 per channel")
        options = {"num_warps": tile.pop("num_warps"), "num_stages": 1, **on}
        constexprs = {**common, "FORMAT": fmt, **constexprs, **tile}
        sizes = ("N", "K", "stride_w")
        variants.append(Variant("quant_gemv", "_quant_gemv_kernel", constexprs, options, f"{name}, 1 token", sizes,
                                {**scales, **pointers}))  # fmt: skip
    return variants


def _quant_variants(pdl: dict, on: dict) -> list[Variant]:
    """The one-token quantized GEMV (_quant_gemv_variants); the quantized GEMM (kernels/quant_gemm.py) at the
    launcher's GPU tiles of 16 and 64 tokens (streaming) and 256 (tensor cores), per format; the FP8
    activation quantization."""
    import triton.language as tl

    from kernels.quant_gemm import PER_CHANNEL_GROUP, default_tiles
    from kernels.quant_gemv import DENSE, FP8, INT4, INT8, NF4

    sizes = ("N", "K", "stride_x", "stride_w", "stride_y")
    scales = {"xs_ptr": "*fp32", "ws_ptr": "*fp32", "wz_ptr": "*u8", "codebook_ptr": "*fp32"}
    formats = {  # name: (FORMAT, constexprs, pointer types, fp8 scales per 128 columns)
        "int4 g128 zeros": (
            INT4,
            dict(W_SCALE=1, W_GROUP=128, W_ROW_DIV=1, HAS_ZEROS=True, X_SCALE=0),
            {"w_ptr": "*u8"},
            False,
        ),
        "int8 per channel": (
            INT8,
            dict(W_SCALE=2, W_GROUP=PER_CHANNEL_GROUP, W_ROW_DIV=1, HAS_ZEROS=False, X_SCALE=0),
            {"w_ptr": "*i8"},
            False,
        ),
        "nf4": (NF4, dict(W_SCALE=1, W_GROUP=64, W_ROW_DIV=1, HAS_ZEROS=False, X_SCALE=0), {"w_ptr": "*u8"}, False),
        "fp8 blocks": (
            FP8,
            dict(W_SCALE=1, W_GROUP=128, W_ROW_DIV=128, HAS_ZEROS=False, X_SCALE=1),
            {"w_ptr": "*fp8e4nv", "x_ptr": "*fp8e4nv"},
            True,
        ),
        "fp8 per channel": (
            FP8,
            dict(W_SCALE=2, W_GROUP=128, W_ROW_DIV=1, HAS_ZEROS=False, X_SCALE=2),
            {"w_ptr": "*fp8e4nv", "x_ptr": "*fp8e4nv"},
            False,
        ),
        "bf16": (DENSE, dict(W_SCALE=0, W_GROUP=1, W_ROW_DIV=1, HAS_ZEROS=False, X_SCALE=0), {}, False),
    }
    variants = _quant_gemv_variants(pdl, on)
    for name, (fmt, constexprs, pointers, chunked) in formats.items():
        for tokens in (16, 64, 256):
            tile = default_tiles(fmt, tokens, chunked, on_gpu=True)
            options = {"num_warps": tile.pop("num_warps"), "num_stages": tile.pop("num_stages"), **on}
            group = constexprs["W_GROUP"]
            per_chunk = max(1, tile["BLOCK_K"] // group) if constexprs["W_SCALE"] == 1 or chunked else 1
            dot_fp8 = fmt == FP8 and tile["BLOCK_M"] >= 16
            dot = tl.float32 if fmt == FP8 and not dot_fp8 else tl.bfloat16
            variants.append(
                Variant(
                    "quant_gemm",
                    "_quant_gemm_kernel",
                    dict(
                        FORMAT=fmt,
                        **constexprs,
                        SCALES_PER_CHUNK=per_chunk,
                        DOT_FP8=dot_fp8,
                        DOT_DTYPE=dot,
                        DOT_PRECISION="tf32",
                        **tile,
                        **pdl,
                    ),
                    options,
                    f"{name}, {tokens} tokens",
                    sizes,
                    {**scales, **pointers},
                )
            )
    quantize = {"xq_ptr": "*fp8e4nv", "scales_ptr": "*fp32"}
    return variants + [
        Variant("fp8_activations", "_quantize_fp8_kernel", dict(GROUP=128, BLOCK=128, STATIC=False, **pdl),
                {"num_warps": 1, **on}, "groups of 128", ("K", "stride_x"), quantize),
        Variant("fp8_activations", "_quantize_fp8_kernel", dict(GROUP=4096, BLOCK=4096, STATIC=False, **pdl),
                {"num_warps": 8, **on}, "per token, K = 4096", ("K", "stride_x"), quantize),
        Variant("fp8_activations", "_quantize_fp8_kernel", dict(GROUP=14336, BLOCK=16384, STATIC=False, **pdl),
                {"num_warps": 16, **on}, "per token, K = 14336", ("K", "stride_x"), quantize),
    ]  # fmt: skip


def _signature(fn, constexprs: dict, pointer_types: dict | None = None) -> dict:
    """Argument name -> Triton type: constexprs by name, pointers bf16 unless POINTER_TYPES says, scalars i32."""
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_desc"):  # prefill attention's K/V boxes (its only TMA descriptors)
            signature[name] = f"tensordesc<bf16[{constexprs['BLOCK_N']},{constexprs['HEAD_DIM']}]>"
        elif name.endswith("_ptr"):
            signature[name] = (pointer_types or {}).get(name) or POINTER_TYPES.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    return signature


def _compile_error(exc: Exception) -> str:
    """One line: Triton's `at LINE:COL:` and the cause (its message is the source with a caret)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and line.strip() != "^"]
    where = next((line for line in lines if line.startswith("at ")), "")
    cause = repr(exc.__cause__) if exc.__cause__ is not None else (lines[-1] if lines else "")
    return f"{type(exc).__name__} {where} {cause}"[:400]


def _nvdisasm() -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm")


def compile_variant(variant: Variant, sass_dir: Path | None = None) -> dict:
    """{kernel, label, ok, error | registers, spill_instructions, shared_bytes} of one variant."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(f"kernels.{variant.module}"), variant.kernel)
    row = {"kernel": f"{variant.module}.{variant.kernel}", "label": variant.label}
    # 16-byte aligned pointers and strides, as the engine's tensors are (Triton specializes on it at launch)
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
               if n not in variant.constexprs
               and (n.endswith("_ptr") or n.startswith("stride") or n in variant.multiples_of_16)}  # fmt: skip
    unknown = set(variant.multiples_of_16) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{variant.kernel} has no arguments {sorted(unknown)}")
    try:
        source = ASTSource(
            fn, _signature(fn, variant.constexprs, variant.pointer_types), constexprs=variant.constexprs, attrs=aligned
        )
        compiled = triton.compile(source, target=GPUTarget(*TARGET), options=variant.options)
    except Exception as exc:  # the report names the variant and the compiler's message
        return {**row, "ok": False, "error": _compile_error(exc)}
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"inferq_compile_check_{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([_nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    cubin.unlink()
    if sass_dir is not None:
        suffix = "." + re.sub(r"[^a-z0-9]+", "_", variant.label) if variant.label else ""
        (sass_dir / f"{variant.module}.{variant.kernel}{suffix}.sass").write_text(sass)
    registers = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1
    spills = sum(1 for line in sass.splitlines() if re.search(r"\b(STL|LDL)\b", line))
    return {**row, "ok": True, "registers": registers, "spill_instructions": spills,
            "shared_bytes": compiled.metadata.shared}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sass", type=Path, default=None, help="write each variant's SASS into this folder")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    if args.sass is not None:
        args.sass.mkdir(parents=True, exist_ok=True)
    rows = [compile_variant(v, args.sass) for v in _variants()]
    print(f"sm_{TARGET[1]} | kernel | variant | registers (highest R + 1) | spill instructions | shared bytes")
    for r in rows:
        if r["ok"]:
            figures = f"{r['registers']} | {r['spill_instructions']} | {r['shared_bytes']}"
            print(f"ok | {r['kernel']} | {r['label']} | {figures}")
        else:
            print(f"FAILED | {r['kernel']} | {r['label']} | {r['error']}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
