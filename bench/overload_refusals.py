"""What a refusal under overload costs the API: `python -m api` with its queue capped at QUEUE_CAP, no worker,
and bursts of BURST concurrent streaming chat requests (auth on; a chat body of --chars characters, which the
API tokenizes to admit).

    python -m bench.overload_refusals                      # this tree
    python -m bench.overload_refusals --tree /tmp/old      # another checkout's api/, same venv

After a warm-up (BURST concurrent GET /ready, so that the API's Redis pool is as large as a busy server's), two
shapes, each burst on connections opened beforehand and written at once (plain sockets, so the client's own
work stays out of the API's way):
- first burst: the queue is empty; QUEUE_CAP requests are admitted (their streams are held open, no worker
  answers them) and the rest are refused with 503;
- full-queue bursts (ROUNDS of them, the admitted streams still open): every request is refused with 503.
For each: the refusals' latency (burst start to the whole 503 read; median, max) and the API's CPU
(user + system, /proc) over the burst, divided by the requests in it. Prints and writes
overload_refusals.json into $OUT. On the 2-core dev box the clients, the API and Redis share two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import redis
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from bench.report import write_json
from bench.service_processes import cpu_s, free_port, private_redis
from worker.protocol import Keys, ModelInfo, tokenizer_fields

MODEL = "bench"
API_KEY = "sk-bench"
QUEUE_CAP = 16
BURST = 200
ROUNDS = 3
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs on through the field. "


def _body(chars: int) -> dict:
    """A streaming chat request of two turns holding `chars` characters of prose between them."""
    content = SENTENCE * max(1, chars // (2 * len(SENTENCE)))
    messages = [{"role": "system", "content": content}, {"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "max_tokens": 16, "stream": True}


def _byte_tokenizer_json() -> str:
    """Every UTF-8 byte one token: a real tokenizer's work per character, no vocabulary file needed."""
    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer.to_str()


def _request(port: int, chars: int) -> bytes:
    body = json.dumps(_body(chars)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {API_KEY}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, start: float):
    """Writes the request; reads a refusal to its end, an admitted stream to its headers (kept open)."""
    writer.write(request)
    raw = bytearray()
    while b"\r\n\r\n" not in raw:
        data = await reader.read(1 << 16)
        if not data:
            break
        raw += data
    status = int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/") else 0
    if status != 200:
        while data := await reader.read(1 << 16):  # connection: close; the refusal's body to its end
            raw += data
        writer.close()
    return status, time.perf_counter() - start, writer


async def _burst(port: int, api_pid: int, chars: int) -> tuple[dict, list]:
    request = _request(port, chars)
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(BURST)]
    cpu_before = cpu_s(api_pid)
    start = time.perf_counter()
    results = await asyncio.gather(*(_one(r, w, request, start) for r, w in connections))
    cpu_ms = (cpu_s(api_pid) - cpu_before) * 1000
    refused = sorted(s for status, s, _ in results if status == 503)
    held = [w for status, _, w in results if status == 200]
    figures = {
        "admitted": len(held),
        "refused": len(refused),
        "other": len(results) - len(held) - len(refused),
        "refusal_ms_median": statistics.median(refused) * 1000 if refused else None,
        "refusal_ms_max": refused[-1] * 1000 if refused else None,
        "api_cpu_ms_per_request": cpu_ms / len(results),
    }
    return figures, held


async def _warm_up(port: int) -> None:
    """BURST concurrent GET /ready: the API's Redis pool holds a connection for each before the first burst, as
    it does on a server that has been busy before (each /ready takes one for its PING)."""
    request = f"GET /ready HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n".encode()

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await reader.read()
        writer.close()

    await asyncio.gather(*(one() for _ in range(BURST)))


async def _measure(port: int, api_pid: int, rounds: int, chars: int) -> dict:
    await _warm_up(port)
    first, held = await _burst(port, api_pid, chars)
    full = []
    for _ in range(rounds):
        figures, more = await _burst(port, api_pid, chars)
        full.append(figures)
        held += more
    for writer in held:
        writer.close()
    return {"first_burst": first, "full_queue_bursts": full}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="checkout whose api/ runs")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="full-queue bursts")
    parser.add_argument("--chars", type=int, default=1500, help="characters of prose in each request")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results/tmp"))
    args = parser.parse_args(argv)
    port = free_port()
    with private_redis() as redis_url:
        client = redis.Redis.from_url(redis_url)
        info = ModelInfo(model=MODEL, max_model_len=1 << 17, vocab_size=256, eos_token_ids=[0])
        client.set(Keys("inferq").model, info.to_json())
        client.hset(Keys("inferq").tokenizer, mapping=tokenizer_fields(_byte_tokenizer_json(), CHAT_TEMPLATE, "", ""))
        env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "INFERQ_HOST": "127.0.0.1", "INFERQ_PORT": str(port),
               "INFERQ_API_KEYS": API_KEY, "INFERQ_MAX_QUEUED_REQUESTS": str(QUEUE_CAP),
               "INFERQ_RESUME_GRACE_S": "60"}  # fmt: skip
        api = subprocess.Popen([sys.executable, "-m", "api"], cwd=args.tree, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or api.poll() is not None:
                        raise SystemExit("the API did not start") from None
                    time.sleep(0.1)
            time.sleep(1.0)  # the tokenizer's warm-up load
            figures = asyncio.run(_measure(port, api.pid, args.rounds, args.chars))
        finally:
            api.terminate()
            api.wait(20)
    result = {
        "tree": args.tree,
        "cpus": os.cpu_count(),
        "queue_cap": QUEUE_CAP,
        "burst": BURST,
        "chars": args.chars,
        **figures,
    }
    write_json(args.out, "overload_refusals.json", result)
    return result


if __name__ == "__main__":
    main()
