"""/tokenize and /detokenize (aliases /v1/tokenize, /v1/detokenize) in SGLang's shape, so clients
(lm-eval's remote tokenizer, routers) need no local copy of the tokenizer.

    /tokenize    {"prompt": str | [str], "add_special_tokens": true} -> {"tokens", "count", "max_model_len"}
    /detokenize  {"tokens": [int] | [[int]], "skip_special_tokens": true} -> {"text"}
"""

from __future__ import annotations

from typing import List

from sglang.srt.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager


class OpenAIServingTokenize:
    def __init__(self, tokenizer_manager: TokenizerManager) -> None:
        self.tm = tokenizer_manager

    def _tokenizer(self):
        if self.tm.tokenizer is None:
            raise RequestError("this server runs with --skip-tokenizer-init: it has no tokenizer")
        return self.tm.tokenizer

    def _encode(self, req: TokenizeRequest) -> TokenizeResponse:
        tok = self._tokenizer()
        texts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        ids = [tok.encode(t, add_special_tokens=req.add_special_tokens) for t in texts]
        if isinstance(req.prompt, str):
            return TokenizeResponse(tokens=ids[0], count=len(ids[0]), max_model_len=self.tm.context_len)
        return TokenizeResponse(tokens=ids, count=[len(i) for i in ids], max_model_len=self.tm.context_len)

    def _decode(self, req: DetokenizeRequest) -> DetokenizeResponse:
        tok = self._tokenizer()
        batch = bool(req.tokens) and isinstance(req.tokens[0], list)
        seqs: List[List[int]] = req.tokens if batch else [req.tokens]
        for i, seq in enumerate(seqs):
            bad = [t for t in seq if not 0 <= t < self.tm.vocab_size]
            if bad:
                where = f"tokens.{i}" if batch else "tokens"
                raise RequestError(f"{where}: ids out of the vocabulary [0, {self.tm.vocab_size}): {bad[:5]}")
        texts = [tok.decode(seq, skip_special_tokens=req.skip_special_tokens) for seq in seqs]
        return DetokenizeResponse(text=texts if batch else texts[0])

    async def tokenize(self, req: TokenizeRequest) -> dict:
        # No context-length check: counting a long document's tokens is a use (the body limit bounds it).
        return (await self.tm.run_cpu(self._encode, req)).model_dump()

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        return (await self.tm.run_cpu(self._decode, req)).model_dump()
