"""Constrained decoding with llguidance (--grammar-backend llguidance; PyPI `llguidance`): the same kinds as
xgrammar, compiled (validated against the model's vocabulary) off the scheduler loop and cached
(base_backend.py), one LLMatcher per request filling xgrammar's bitmask layout.

json_schema is compact JSON (", " and ": ", no free whitespace) as with xgrammar; ebnf is the GBNF dialect
xgrammar reads (converted to llguidance's Lark); structural_tag (and so a forced tool_choice) is xgrammar's
format, which this backend refuses by name.
"""

from __future__ import annotations

import json
from typing import Any, List

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from llguidance.gbnf_to_lark import any_to_lark

from sglang.srt.constrained.base_backend import GrammarBackend, GrammarCompileError
from sglang.srt.constrained.grammar_key import ANY_JSON, GrammarKey

COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class LLGuidanceMatcher:
    """An LLMatcher with xgrammar's method names; terminated once a stop token ends the completed grammar
    (llguidance's own `is_stopped` is already true when only a stop token may follow)."""

    def __init__(self, tokenizer: "llguidance.LLTokenizer", grammar: str, stop_token_ids: List[int]) -> None:
        self.matcher = llguidance.LLMatcher(tokenizer, grammar)
        self.stop_token_ids = set(stop_token_ids)
        self._ended = False

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, row)
        if self.matcher.is_error():
            # Where no output can satisfy the grammar (from its start, or from here on) llguidance allows the stop
            # token, which would end the request as if it had succeeded. No token is allowed instead: the
            # unsatisfiable grammar is refused (base_backend._check_satisfiable, grammar_bitmask) with a 400.
            bitmask[row].zero_()

    def accept_token(self, token: int) -> bool:
        ok = self.matcher.consume_token(token)
        if ok and token in self.stop_token_ids and self.matcher.is_stopped():
            self._ended = True
        return ok

    def is_terminated(self) -> bool:
        return self._ended

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self._ended = False


class LLGuidanceBackend(GrammarBackend):
    def _load_vocabulary(self, tokenizer: Any, vocab_size: int, stop_token_ids: List[int], threads: int) -> None:
        self.stop_token_ids = stop_token_ids
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids)

    def _new_matcher(self, compiled: str) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.tokenizer, compiled, self.stop_token_ids)

    def _compile(self, key: GrammarKey) -> str:
        """The grammar text llguidance matches with, checked against the vocabulary."""
        if key.kind == "structural_tag":
            raise GrammarCompileError("structural_tag: not served by --grammar-backend llguidance (use xgrammar)")
        try:
            if key.kind == "json_schema":
                schema = "{}" if key.text == ANY_JSON else key.text
                grammar = llguidance.LLMatcher.grammar_from_json_schema(json.loads(schema), defaults=COMPACT_JSON)
            elif key.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(key.text)
            elif key.kind == "ebnf":
                grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(key.text))
            else:
                raise GrammarCompileError(f"unknown constraint kind {key.kind!r}")
            error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        except GrammarCompileError:
            raise
        except Exception as e:  # noqa: BLE001 - llguidance raises ValueError / its converter's own kinds
            error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if error:
            raise GrammarCompileError(f"{key.kind}: does not compile: {error.strip().splitlines()[0]}")
        return grammar
