"""The per-request checks a long token-id prompt meets on its way in, timed on this machine (no Redis, no GPU):
the API's unicode walk over the body (api/unsupported.py), its vocabulary check (api/limits.py), the protocol's
encode on the API and decode on the worker's loop thread (worker/protocol), for a prompt of 1,024 ids.

    python -m bench.request_parse_costs                  # this tree
    python -m bench.request_parse_costs --tree /tmp/old  # another checkout, same venv

Why: in a burst these run once a request, one after another on each API process's event loop (so they delay
every request's XADD behind them) and on the worker's one thread (bench/socket_clients.py's docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import timeit

from bench.report import write_json


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=None, help="checkout whose api/ and worker/ are timed")
    parser.add_argument("--ids", type=int, default=1024)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    return parser.parse_args(argv)


def _best_us(fn, number: int = 200) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def measure(num_ids: int) -> dict:
    from api.limits import check_token_ids
    from api.schemas import CompletionRequest
    from api.unsupported import invalid_unicode_path
    from worker.protocol import ModelInfo, RequestMessage, decode_request, encode_request

    rng = random.Random(0)
    ids = [rng.randrange(1, 150_000) for _ in range(num_ids)]
    body = {"model": "m", "prompt": ids, "max_tokens": 16, "stream": True}
    request = CompletionRequest.model_validate(body)
    info = ModelInfo(model="m", max_model_len=4096, vocab_size=151_936, eos_token_ids=[0])
    fields = encode_request(RequestMessage(id="r1", prompt_token_ids=ids, params={"max_tokens": 16}))
    wire = {k.encode(): v.encode() for k, v in fields.items()}  # as redis-py hands them to the worker
    return {
        "ids": num_ids,
        "api_unicode_walk_us": _best_us(lambda: invalid_unicode_path(body, "")),
        "api_vocab_check_us": _best_us(lambda: check_token_ids(info, request)),
        "api_body_validation_us": _best_us(lambda: CompletionRequest.model_validate(body)),
        "api_encode_request_us": _best_us(lambda: encode_request(RequestMessage(id="r1", prompt_token_ids=ids))),
        "worker_decode_request_us": _best_us(lambda: decode_request(wire)),
    }


def main(argv=None) -> dict:
    args = _parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)
    result = {"tree": args.tree or "this", **measure(args.ids)}
    write_json(args.out, "request_parse_costs.json", result)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
