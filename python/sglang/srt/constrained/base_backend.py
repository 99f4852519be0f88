"""What every grammar backend (--grammar-backend xgrammar / llguidance) shares: compiling off the scheduler
loop on a small thread pool behind an LRU cache keyed by (kind, text), and one RequestGrammar per request.

A request waits only for its own grammar, and a repeated constraint costs nothing. A grammar that does not
compile fails its future with GrammarCompileError naming the field; the scheduler answers that request with
a 400 and keeps serving the others. So does a grammar no output can satisfy, found when it compiles where no
token may start it (or follow the text it forces); a dead end found later, while decoding, finishes its request
with a 400 too (sampling_batch_info.grammar_bitmask). Token bitmasks are xgrammar's layout
([bs, ceil(vocab / 32)] int32, a set bit allows the token), which llguidance fills too
(xgrammar_backend.allocate_bitmask / apply_bitmask).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Tuple

import torch

from sglang.srt.constrained.grammar_key import UNSATISFIABLE, GrammarKey
from sglang.srt.constrained.reasoning_gate import ReasoningGate

COMPILE_THREADS = 2
CACHE_SIZE = 512
# The unsatisfiable-grammar check follows at most this many forced strings (each one a jump-forward step).
MAX_FORCED_STEPS = 64


class GrammarCompileError(ValueError):
    """A constraint that does not compile; the message names the sampling_params field."""


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    size: int


class TokenMatcher(Protocol):
    """A backend's per-request matcher, with xgrammar's GrammarMatcher method names."""

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> Any: ...

    def accept_token(self, token: int) -> bool: ...

    def is_terminated(self) -> bool: ...

    def rollback(self, num_tokens: int) -> Any: ...


class RequestGrammar:
    """One request's matcher: the tokens allowed next, advanced by each token the request accepts.
    With `reasoning_end` (the request thinks first), every token is allowed until those ids end the
    reasoning; the grammar applies from the next token on."""

    def __init__(self, matcher: TokenMatcher, key: GrammarKey, reasoning_end: Tuple[int, ...] = ()) -> None:
        self.key = key
        self.matcher = matcher
        self.gate = ReasoningGate(reasoning_end)
        self.accepted = 0  # tokens the grammar accepted (rollback is bounded by this)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Set `row` to the tokens allowed next (while the model reasons, it stays all-allowed)."""
        if self.gate.open:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def at_dead_end(self) -> bool:
        """For a row `fill_bitmask` left all-false: True if the grammar is not complete, so no output can satisfy it
        from here (an all-false row would let the sampler pick token 0)."""
        return not self.matcher.is_terminated()

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


class GrammarBackend:
    """The compile pool and cache; a backend says how to compile a key and how to match a compiled grammar."""

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
        self.vocab_size = vocab_size
        self._load_vocabulary(tokenizer, vocab_size, list(stop_token_ids or [tokenizer.eos_token_id]), threads)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar-compile")
        self.cache_size = cache_size
        self._cache: "OrderedDict[GrammarKey, Future]" = OrderedDict()
        self._lock = threading.Lock()  # the cache is read by the scheduler, filled by it and the tests
        self._hits = 0
        self._misses = 0

    def compile_async(self, key: GrammarKey) -> Future:
        """The compiled grammar, from the cache or compiling now on the pool. A failed compile stays cached
        too: the same bad schema is refused again without compiling it again."""
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self._hits += 1
                return future
            self._misses += 1
            future = self.pool.submit(self._compile_satisfiable, key)
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return future

    def compile(self, key: GrammarKey) -> Any:
        return self.compile_async(key).result()

    def matcher(self, compiled: Any, key: GrammarKey, reasoning_end: Tuple[int, ...] = ()) -> RequestGrammar:
        return RequestGrammar(self._new_matcher(compiled), key, reasoning_end)

    def cache_stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._cache))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _compile_satisfiable(self, key: GrammarKey) -> Any:
        compiled = self._compile(key)
        self._check_satisfiable(compiled, key)
        return compiled

    def _check_satisfiable(self, compiled: Any, key: GrammarKey) -> None:
        """GrammarCompileError naming the field when no output can satisfy the grammar: no token may start it
        (`[^\\s\\S]`), or none may follow the text it forces (`a[^\\s\\S]`: after "a"). Decoding it would
        otherwise sample from an all-false mask. A dead end past a choice is found while decoding."""
        matcher = self._new_matcher(compiled)
        bitmask = torch.full((1, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
        forced = ""
        for _ in range(MAX_FORCED_STEPS):
            matcher.fill_next_token_bitmask(bitmask, 0)
            if not bitmask[0].any() and not matcher.is_terminated():
                where = f"after the text it forces ({forced[:200]!r})" if forced else "from its start"
                raise GrammarCompileError(f"{key.kind}: {UNSATISFIABLE}: {where} the grammar allows no token")
            step = self._accept_forced(matcher)
            if not step:
                return
            forced += step

    def _accept_forced(self, matcher: TokenMatcher) -> str:
        """Advance `matcher` past the text its grammar forces next, if the backend can tell; that text, or ""."""
        return ""

    def _load_vocabulary(self, tokenizer: Any, vocab_size: int, stop_token_ids: List[int], threads: int) -> None:
        raise NotImplementedError

    def _compile(self, key: GrammarKey) -> Any:
        raise NotImplementedError

    def _new_matcher(self, compiled: Any) -> TokenMatcher:
        raise NotImplementedError
