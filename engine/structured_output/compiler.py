"""Compiles constraints into xgrammar grammars on worker threads, never on the engine loop, with an LRU cache
keyed by (kind, canonical text).

The engine submits a request's constraint when the request arrives and schedules the request only once
`poll` says its grammar is ready; a compile that fails, or that is still running after the time limit, fails
that request alone with a message naming its field. NOTE: a compile past its limit cannot be interrupted
(xgrammar offers no cancel): it keeps its thread until it ends, and its result stays cached for the next
request that asks for the same constraint.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import xgrammar as xgr

from engine.structured_output.constraint import FIELD

DEFAULT_CACHE_ENTRIES = 512


class CompileFailed(Exception):
    """A constraint that does not compile; str() names the field (`structured_output.<kind>: ...`)."""


class GrammarCompileService:
    """One per engine.

    Args:
        tokenizer: the model's HF tokenizer.
        vocab_size: the model's vocabulary (its logits' width; may exceed the tokenizer's).
        stop_token_ids: the ids that end a request (EOS): the grammar's end accepts only these.
        timeout_s: the longest a request waits for its grammar.
        num_threads: compile threads.
        cache_entries: compiled grammars kept (least recently used go first).
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], *, timeout_s: float = 10.0,
                 num_threads: int = 2, cache_entries: int = DEFAULT_CACHE_ENTRIES) -> None:  # fmt: skip
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids) or None
        )
        # NOTE: xgrammar's own cache is off: ours is keyed by the request's text and bounded by entries
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=1, cache_enabled=False)
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self.timeout_s = timeout_s
        self.cache_entries = cache_entries
        self.num_hits = 0
        self.num_compiles = 0

    def submit(self, key: tuple[str, str]) -> Future:
        """The future CompiledGrammar of a (kind, canonical text) key (constraint.constraint_key): the cached one,
        or a new compile on a worker thread."""
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self.num_hits += 1
                return future
            self.num_compiles += 1
            future = self._pool.submit(self._compile, *key)
            self._cache[key] = future
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
            return future

    def compile_now(self, key: tuple[str, str]) -> xgr.CompiledGrammar:
        """submit, then wait up to the time limit (tests and benchmarks); raises CompileFailed."""
        future = self.submit(key)
        started = time.monotonic()
        while not future.done():
            if time.monotonic() - started > self.timeout_s:
                raise CompileFailed(self.timeout_message(key[0]))
            time.sleep(0.001)
        return future.result()

    def timeout_message(self, kind: str) -> str:
        return f"{FIELD}.{kind}: the grammar did not compile within {self.timeout_s:g} s"

    def _compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
        try:
            if kind == "json":
                return self._compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "json_object":
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(text)
            if kind == "choice":
                alternatives = " | ".join(_ebnf_string(choice) for choice in json.loads(text))
                return self._compiler.compile_grammar(f"root ::= {alternatives}")
            return self._compiler.compile_grammar(text, root_rule_name="root")
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError with its own message
            reason = " ".join(str(exc).split())[:500] or type(exc).__name__
            raise CompileFailed(f"{FIELD}.{kind}: {reason}") from exc

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ebnf_string(text: str) -> str:
    """An EBNF string literal matching exactly `text` (xgrammar reads JSON-style escapes)."""
    return json.dumps(text, ensure_ascii=False)
