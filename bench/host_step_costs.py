"""Two pieces of the engine's per-step host work, without a GPU: detokenizing one token for each running
request, and the sampled step's (seed, position) keys.

    python -m bench.host_step_costs          # writes host_step_costs.json into $OUT

- detokenize: make_detokenizer's two kinds over the packaged SmolLM2 tokenizer (byte-level BPE), each
  request's context 20 random tokens, then one random token a request a step: the window re-decoded
  through the Rust tokenizer (engine/tokenizer.py's _BackendDecoder), and the byte stream over the
  ByteLevelTable (engine/byte_level.py), which the engine takes for such tokenizers.
- keys: engine.sampler.sampling_keys for that many requests with random seeds (the sampled step's
  per-row hashing), against three uncached mixes a row (sampling_key's form before it cached the seed's).

Each figure is the best of 5 repeats, in ms per step.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from bench.report import write_json


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


def _best_ms(fn, repeats: int = 5) -> float:
    """fn() runs `steps` steps and returns how many; the best per-step time over the repeats."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        steps = fn()
        best = min(best, (time.perf_counter() - start) / steps * 1000)
    return best


def detokenize_ms(decoder, vocab_size: int, requests: int, steps: int) -> float:
    """Best of 5: ms a step for `requests` detokenizers taking one token each (their set-up not timed)."""
    from engine.detokenizer import make_detokenizer

    best = float("inf")
    for _ in range(5):
        rng = random.Random(1)
        dets = [make_detokenizer(decoder, [rng.randrange(vocab_size) for _ in range(20)]) for _ in range(requests)]
        tokens = [[rng.randrange(vocab_size) for _ in range(requests)] for _ in range(steps)]
        start = time.perf_counter()
        for step in tokens:
            for det, token in zip(dets, step, strict=True):
                det.add_tokens([token])
        best = min(best, (time.perf_counter() - start) / steps * 1000)
    return best


def keys_ms(requests: int) -> tuple[float, float]:
    from engine.request import Request
    from engine.sampler import _mix32_int, _seed_key, sampling_keys
    from engine.sampling_params import SamplingParams

    rng = random.Random(2)
    params = SamplingParams(temperature=0.8)
    rows = [Request(f"r{i}", [1] * 100, params, seed=rng.getrandbits(63)) for i in range(requests)]
    m32 = 0xFFFFFFFF

    def uncached() -> int:
        for _ in range(100):
            for r in rows:
                seed_key = _mix32_int((r.seed & m32) ^ _mix32_int((r.seed >> 32) & m32))
                _mix32_int(seed_key ^ (r.num_tokens_with_pending & m32))
        return 100

    def cached() -> int:
        for _ in range(100):
            sampling_keys(rows)
        return 100

    assert [_mix32_int(_seed_key(r.seed) ^ r.num_tokens_with_pending) for r in rows] == sampling_keys(rows)
    return _best_ms(uncached), _best_ms(cached)


def main(argv=None) -> dict:
    args = _parse_args(argv)
    from engine.byte_level import ByteLevelTable
    from engine.tokenizer import _BackendDecoder, fast_decoder, load_tokenizer
    from engine.weights.default_model import default_gguf_path
    from engine.weights.gguf import convert_gguf

    cache_dir = os.environ.get("INFERQ_CACHE_DIR", "/tmp/inferq-cache")
    tokenizer = load_tokenizer(convert_gguf(default_gguf_path(), cache_dir))
    table = fast_decoder(tokenizer)
    assert isinstance(table, ByteLevelTable)
    vocab = len(tokenizer)
    window = detokenize_ms(_BackendDecoder(tokenizer._tokenizer), vocab, args.requests, args.steps)
    stream = detokenize_ms(table, vocab, args.requests, args.steps)
    uncached, cached = keys_ms(args.requests)
    result = {"requests": args.requests, "python": sys.version.split()[0], "cpus": os.cpu_count(),
              "detokenize_window_rust_ms": window, "detokenize_byte_stream_ms": stream,
              "keys_uncached_ms": uncached, "keys_cached_ms": cached}  # fmt: skip
    write_json(args.out, "host_step_costs.json", result)
    print(result, flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
