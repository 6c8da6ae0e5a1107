"""Command line: stream a completion to the terminal.

python -m engine.generate --model PATH_OR_ID --prompt "Hello" [--chat] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
import time

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.generate", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="checkpoint dir, .gguf, Hub id, 'default' or 'gemma3-270m'")
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt as one user message (chat template)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--quantization", default=None, choices=("fp8", "int8", "int4", "nf4"),
                   help="quantize the linear layers at load (docs/quantization.md)")  # fmt: skip
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--num-kv-tokens", type=int, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=args.dtype,
            load_format=args.load_format,
            max_model_len=args.max_model_len,
            quantization=args.quantization,
        ),
        cache=CacheConfig(num_kv_tokens=args.num_kv_tokens),
        device=args.device,
    )
    engine = LLMEngine(config)
    if args.chat:
        prompt_ids = engine.apply_chat_template([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = engine.encode(args.prompt)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    engine.add_request("cli", prompt_ids, params)
    started, first, n, reason = time.monotonic(), None, 0, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids and first is None:
                first = time.monotonic()
            n += len(out.new_token_ids)
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
            reason = out.finish_reason or reason
    elapsed = time.monotonic() - started
    ttft = (first - started) if first else float("nan")
    summary = f"{n} tokens, finish_reason={reason}, ttft {ttft * 1000:.0f} ms, {n / elapsed:.1f} tok/s"
    print(f"\n[{summary}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
