"""What the engine benchmarks share: the environment record, the ceilings, model directories
with random weights, the transformers peer, and writing results.

Model shapes come from bench/configs/<name>/config.json. The engine builds them with random
weights (load_format "dummy"); their directory gets a synthetic byte-level BPE tokenizer of the
config's vocabulary size (the kind Llama 3, Qwen and GPT-2 ship), so the engine detokenizes every
token as it would a real model's (the benchmarks use random token ids, which a real tokenizer of
another vocabulary could not decode). Until 2026-11-25 it was a word-level tokenizer without a
decoder, which the engine's byte-level fast path (engine/byte_level.py) does not take.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

from bench.report import results_folder

CONFIGS = Path(__file__).resolve().parent / "configs"


def async_scheduling_setting() -> bool | None:
    """The engines' async scheduling, from INFERQ_ASYNC_SCHEDULING (the worker's setting of the
    same name): unset means the engine's default (on for CUDA); "false" gives the synchronous
    baseline in the same device call."""
    value = os.environ.get("INFERQ_ASYNC_SCHEDULING", "").strip().lower()
    if value in ("", "auto", "none"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"INFERQ_ASYNC_SCHEDULING must be true or false, got {value!r}")


def dummy_weights_engine(directory: Path, device: torch.device, dry_run: bool, max_model_len: int, cache: dict,
                         scheduler: dict):  # fmt: skip
    """An LLMEngine over random weights of the config in `directory` (load_format dummy; bf16, float32 on a dry
    run), with the cache's and scheduler's settings given and the async scheduling of async_scheduling_setting."""
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.llm_engine import LLMEngine

    dtype = "float32" if dry_run else "bfloat16"
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(directory), dtype=dtype, load_format="dummy", max_model_len=max_model_len),
            cache=CacheConfig(**cache),
            scheduler=SchedulerConfig(**scheduler),
            device=device.type,
            async_scheduling=async_scheduling_setting(),
        )
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _one_token_dispatch(device: torch.device) -> dict:
    from engine import ops

    return {"gemv_min_features": ops.gemv_min_features(device),
            "norm_gemv_min_features": ops.norm_gemv_min_features(device),
            "swiglu_gemv_max_features": ops.SWIGLU_GEMV_MAX_FEATURES,
            "qkv_rope_fusion": ops.QKV_ROPE_FUSION,
            # the few-rows kernels (kernels/gemv_rows.py): up to this many tokens, weights up to this many elements
            "gemv_rows_max": ops.GEMV_ROWS_MAX, "gemv_rows_max_weights": ops.GEMV_ROWS_MAX_WEIGHTS}  # fmt: skip


def environment(device: torch.device) -> dict:
    import transformers
    import triton

    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "async_scheduling": {None: "engine default", True: "on", False: "off"}[async_scheduling_setting()],
        # engine.ops's one-token dispatch thresholds: which projections take the GEMV kernels, SwiGLU inside or not
        **_one_token_dispatch(device),
        # The host: the service's figures swing with it (bench/results/HISTORY.md).
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),  # fewer when pinned (--isolate-worker)
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(gpu=props.name, sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1))
        from kernels._pdl import use_pdl

        meta["pdl"] = use_pdl(device)  # programmatic dependent launch of the decode kernels (kernels/_pdl.py)
    else:
        meta.update(gpu="none (CPU dry run: code paths only, figures meaningless)")
    return meta


def ceilings(device: torch.device, dry_run: bool) -> dict:
    """Read bandwidth (large reduction) and bf16 matmul rate, measured now (bench/kernel_timing.py)."""
    from bench.kernel_timing import Bench, measure_ceilings

    return measure_ceilings(Bench.on(device, dry_run))


# A dry run's stand-in for any shape: the same architecture, tiny (CPU, code paths only).
TINY_OVERRIDES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
}


def model_dir(name: str, tiny: bool = False) -> Path:
    """A directory with bench/configs/<name>/config.json (shrunk when tiny) and a synthetic
    byte-level BPE tokenizer of its vocabulary."""
    source = CONFIGS / name / "config.json"
    if not source.is_file():
        raise SystemExit(f"no config {source}; known: {sorted(p.name for p in CONFIGS.iterdir())}")
    config = json.loads(source.read_text())
    text = text_config(config)
    if tiny:
        text.update({k: v for k, v in TINY_OVERRIDES.items() if k in text or k == "head_dim"})
    out = Path(tempfile.mkdtemp(prefix=f"inferq-{name}-"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    byte_level_tokenizer(int(text["vocab_size"])).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


def byte_level_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer of vocab_size tokens: the 256 bytes, then words (" a", " b", ...,
    " aa", ...) as real vocabularies hold them after their byte tokens. No merges: it decodes
    every id as a real one would, and encodes only byte by byte (the benchmarks send token ids)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    # GPT-2's byte -> printable character map (what a byte-level vocabulary's strings are made of)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    char_of = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    vocab = {char_of[b]: b for b in range(256)}
    for token_id in range(256, vocab_size):
        word, n = "", token_id - 256
        while True:
            word = chr(ord("a") + n % 26) + word
            n = n // 26 - 1
            if n < 0:
                break
        vocab[char_of[ord(" ")] + word] = token_id
    tokenizer = Tokenizer(BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def text_config(config: dict) -> dict:
    """The language model's part of a config.json dict: its text_config where it has one (a multimodal
    checkpoint such as Gemma-3-4B, served text-only), else itself."""
    return config.get("text_config", config)


def vocab_size_of(directory: Path) -> int:
    return int(text_config(json.loads((directory / "config.json").read_text()))["vocab_size"])


def hf_model(directory: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' model of the shape in `directory` with random weights (its own init), eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(directory))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def left_padded(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of the prompts as one batch, left-padded as generation with a batch needs."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def timed_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, device: torch.device) -> float:
    """Seconds for the peer's `generate` of exactly new_tokens greedy tokens a row (ignore_eos: min = max)."""
    import time

    synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)  # fmt: skip
    synchronize(device)
    seconds = time.perf_counter() - start
    if out.shape != (ids.shape[0], ids.shape[1] + new_tokens):
        expected = (ids.shape[0], ids.shape[1] + new_tokens)
        raise RuntimeError(f"generate returned {tuple(out.shape)}, expected {expected}")
    return seconds


def freeze_long_lived_objects() -> None:
    """After an engine is built: what `python -m worker` does (worker/__main__.py), so that full
    garbage collections do not walk the start-up objects inside timed steps. free_device_memory
    unfreezes them again (frozen objects are never collected)."""
    gc.collect()
    gc.freeze()


def free_device_memory(device: torch.device) -> None:
    """After a peer ran: give its memory back and forget its peak (the engine sizes its KV pool from the peak)."""
    gc.unfreeze()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def write_results(out: Path, stem: str, results: dict, markdown: str) -> None:
    """JSON and markdown, rewritten after every model so that a cut-off run keeps what it measured."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown)


def header(results: dict, title: str) -> list[str]:
    meta, ceil = results["meta"], results["ceilings"]
    return [
        f"# {title}",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · "
        f"transformers {meta['transformers']} · python {meta['python']}",
        "",
        f"Ceilings measured in the same run: read bandwidth {ceil['read_gbps']:.0f} GB/s (large reduction), "
        f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s.",
    ]


def kernel_bench_device(dry_run: bool) -> torch.device:
    """Where a benchmark of the Triton kernels runs: a dry run on the CPU interpreter (set up here, so call
    this before anything imports triton), else CUDA, which it then needs."""
    if dry_run:
        from kernels.interpreter import use_cpu_interpreter

        use_cpu_interpreter()
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --dry-run for the CPU interpreter")
    return torch.device("cuda")


def run_model_benchmark(tag: str, stem: str, args, measure_model, markdown) -> dict:
    """The shared driver of the engine benchmarks: environment and ceilings, then each model of
    `args.models`, writing JSON + markdown after every model so a later failure keeps the earlier figures.

    Args:
        tag: log prefix, e.g. "decode".
        stem: results file name stem.
        args: parsed flags with models, out, dry_run and skip_hf.
        measure_model: (name, device, ceilings, dry_run, skip_hf) -> dict of figures.
        markdown: results -> the markdown report.
    """
    import torch

    from bench.roofline import check_arithmetic

    check_arithmetic()
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --dry-run")
    device = torch.device("cpu" if args.dry_run else "cuda")
    results: dict = {"meta": environment(device), "ceilings": ceilings(device, args.dry_run), "models": {}}
    print(f"[{tag}] {results['meta']} {results['ceilings']}", flush=True)
    out = results_folder(args.out, args.dry_run)
    for name in [m for m in args.models.split(",") if m]:
        try:
            results["models"][name] = measure_model(name, device, results["ceilings"], args.dry_run, args.skip_hf)
        except Exception as exc:  # keep the other model's figures; the error goes into the report
            import traceback

            traceback.print_exc()
            results["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[{tag}] {name}: {results['models'][name]}", flush=True)
        write_results(out, stem, results, markdown(results))
    print(markdown(results), flush=True)
    return results
