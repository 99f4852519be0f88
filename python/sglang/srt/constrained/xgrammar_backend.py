"""Constrained decoding with xgrammar: compile a request's grammar off the scheduler loop, cached, and
keep one GrammarMatcher per request that says which tokens may come next.

Compiling runs on a small thread pool (xgrammar's compiler works outside the GIL) behind an LRU cache
keyed by (kind, text): a request waits only for its own grammar, and a repeated schema costs nothing.
A grammar that does not compile fails its future with GrammarCompileError naming the field; the
scheduler answers that request with a 400 and keeps serving the others.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import xgrammar as xgr

from sglang.srt.constrained.grammar_key import ANY_JSON, GrammarKey
from sglang.srt.constrained.reasoning_gate import ReasoningGate

COMPILE_THREADS = 2
CACHE_SIZE = 512
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message for the user.
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


class GrammarCompileError(ValueError):
    """A constraint that does not compile; the message names the sampling_params field."""


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    size: int


def _clean(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return _CPP_PREFIX.sub("", text[0] if text else type(e).__name__)


class RequestGrammar:
    """One request's matcher: the tokens allowed next, advanced by each token the request accepts.
    With `reasoning_end` (the request thinks first), every token is allowed until those ids end the
    reasoning; the grammar applies from the next token on."""

    def __init__(self, compiled: "xgr.CompiledGrammar", key: GrammarKey, reasoning_end: Tuple[int, ...] = ()) -> None:
        self.key = key
        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)
        self.gate = ReasoningGate(reasoning_end)
        self.accepted = 0  # tokens the grammar accepted (rollback is bounded by this)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.gate.open:  # while the model reasons its row stays all-allowed
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token: int) -> bool:
        if not self.gate.open:
            self.gate.accept(token)
            return True
        ok = self.matcher.accept_token(token)
        if ok:
            self.accepted += 1
        return ok

    def is_terminated(self) -> bool:
        return self.gate.open and self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        """Forget the last `num_tokens` tokens the grammar accepted (never back into the reasoning)."""
        num_tokens = min(num_tokens, self.accepted)
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self.accepted -= num_tokens


def allocate_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A host bitmask with every token allowed ([bs, ceil(vocab / 32)] int32): rows without a grammar stay so."""
    return xgr.allocate_token_bitmask(batch_size, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Disallowed tokens' logits to -inf, in place, on the logits' device (CPU or CUDA)."""
    vocab = min(logits.shape[-1], bitmask.shape[-1] * 32)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab)


class XGrammarBackend:
    """The compiler over the model's vocabulary, its thread pool and its cache."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Optional[List[int]] = None,
        threads: int = COMPILE_THREADS,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        # vocab_size is the model's (its logits' width), which may exceed the tokenizer's: the padding
        # tokens are then never allowed.
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar-compile")
        self.cache_size = cache_size
        self._cache: "OrderedDict[GrammarKey, Future]" = OrderedDict()
        self._lock = threading.Lock()  # the cache is read by the scheduler, filled by it and the tests
        self._hits = 0
        self._misses = 0

    def compile_async(self, key: GrammarKey) -> "Future[xgr.CompiledGrammar]":
        """The compiled grammar, from the cache or compiling now on the pool. A failed compile stays cached
        too: the same bad schema is refused again without compiling it again."""
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self._hits += 1
                return future
            self._misses += 1
            future = self.pool.submit(self._compile, key)
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return future

    def compile(self, key: GrammarKey) -> "xgr.CompiledGrammar":
        return self.compile_async(key).result()

    def matcher(
        self, compiled: "xgr.CompiledGrammar", key: GrammarKey, reasoning_end: Tuple[int, ...] = ()
    ) -> RequestGrammar:
        return RequestGrammar(compiled, key, reasoning_end)

    def cache_stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._cache))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, key: GrammarKey) -> "xgr.CompiledGrammar":
        try:
            if key.kind == "json_schema":
                if key.text == ANY_JSON:
                    return self.compiler.compile_builtin_json_grammar()
                # Compact JSON (", " and ": " only): with free whitespace a small model can emit newlines until
                # max_new_tokens and never close the object, a known failure of unbounded whitespace.
                return self.compiler.compile_json_schema(key.text, any_whitespace=False)
            if key.kind == "regex":
                return self.compiler.compile_regex(key.text)
            if key.kind == "ebnf":
                return self.compiler.compile_grammar(key.text)
            if key.kind == "structural_tag":
                return self._compile_structural_tag(key.text)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError / its own kinds
            raise GrammarCompileError(f"{key.kind}: does not compile: {_clean(e)}") from None
        raise GrammarCompileError(f"unknown constraint kind {key.kind!r}")

    def _compile_structural_tag(self, text: str) -> "xgr.CompiledGrammar":
        tag = json.loads(text)
        if isinstance(tag, dict) and "structures" in tag:
            # SGLang's (and xgrammar's first) format: {"structures": [{"begin", "schema", "end"}], "triggers"}.
            items = [
                xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                for s in tag["structures"]
            ]
            return self.compiler.compile_structural_tag(items, tag["triggers"])
        return self.compiler.compile_structural_tag(text)
