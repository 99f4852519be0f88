"""Constrained decoding with xgrammar (--grammar-backend xgrammar, the default): a request's grammar compiled
off the scheduler loop, cached (base_backend.py; xgrammar's compiler works outside the GIL), and one
GrammarMatcher per request that says which tokens may come next. The token bitmask helpers here serve
every backend.
"""

from __future__ import annotations

import json
import re
from typing import Any, List

import torch
import xgrammar as xgr

from sglang.srt.constrained.base_backend import GrammarBackend, GrammarCompileError, RequestGrammar
from sglang.srt.constrained.grammar_key import ANY_JSON, GrammarKey

__all__ = ["GrammarCompileError", "RequestGrammar", "XGrammarBackend", "allocate_bitmask", "apply_bitmask"]

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message for the user.
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


def _clean(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return _CPP_PREFIX.sub("", text[0] if text else type(e).__name__)


def allocate_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A host bitmask with every token allowed ([bs, ceil(vocab / 32)] int32): rows without a grammar stay so."""
    return xgr.allocate_token_bitmask(batch_size, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Disallowed tokens' logits to -inf, in place, on the logits' device (CPU or CUDA)."""
    vocab = min(logits.shape[-1], bitmask.shape[-1] * 32)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab)


class XGrammarBackend(GrammarBackend):
    """The compiler over the model's vocabulary, its thread pool and its cache."""

    def _load_vocabulary(self, tokenizer: Any, vocab_size: int, stop_token_ids: List[int], threads: int) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads)

    def _new_matcher(self, compiled: "xgr.CompiledGrammar") -> "xgr.GrammarMatcher":
        return xgr.GrammarMatcher(compiled)

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
