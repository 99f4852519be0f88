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

    def _accept_forced(self, matcher: "xgr.GrammarMatcher") -> str:
        text = matcher.find_jump_forward_string()
        return text if text and matcher.accept_string(text) else ""

    def _check_satisfiable(self, compiled: "xgr.CompiledGrammar", key: GrammarKey) -> None:
        super()._check_satisfiable(compiled, key)
        if key.kind != "structural_tag":
            return
        # A tag's JSON allows free whitespace, where the forced text stops (after a forced call's `{`), so a dead
        # end inside the schema is not seen above. When every output must contain one of some tags' schemas (a
        # forced tool call: the tool's parameters), those schemas are checked compact: if none can be satisfied,
        # neither can the tag.
        refusals = []
        for schema in _forced_tag_schemas(key.text):
            try:
                sub = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
                super()._check_satisfiable(sub, key)
                return
            except GrammarCompileError as e:
                refusals.append(e)
            except Exception:  # noqa: BLE001 - a schema only the tag's compiler reads: nothing to tell
                return
        if refusals:
            raise refusals[0]

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


def _forced_tag_schemas(text: str) -> List[Any]:
    """The JSON schemas of a structural tag of which every output contains one (a lone tag, or triggered tags
    of which at least one must come, each with a json_schema content); [] when the tag is of another shape."""
    try:
        tag = json.loads(text)
    except ValueError:
        return []
    fmt = tag.get("format") if isinstance(tag, dict) and tag.get("type") == "structural_tag" else None
    if not isinstance(fmt, dict):
        return []
    if fmt.get("type") == "tag":
        tags = [fmt]
    elif fmt.get("type") == "triggered_tags" and fmt.get("at_least_one") and isinstance(fmt.get("tags"), list):
        tags = fmt["tags"]
    else:
        return []
    schemas = []
    for t in tags:
        content = t.get("content") if isinstance(t, dict) else None
        if not isinstance(content, dict) or content.get("type") != "json_schema" or "json_schema" not in content:
            return []
        schemas.append(content["json_schema"])
    return schemas
