"""POST /v1/completions: OpenAI's legacy completions API on top of the TokenizerManager.

`prompt` may be a string, a list of strings (one choice per prompt), token ids, or a list of
token-id lists. `logprobs` gives each sampled token's exact logprob; the alternatives of
`top_logprobs` are not computed by the engine, so each entry holds the sampled token only.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from sglang.srt.entrypoints.http_utils import sse_stream, start_generation
from sglang.srt.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
)
from sglang.srt.entrypoints.openai.utils import (
    build_sampling_params,
    check_common_fields,
    finish_reason,
    new_request_id,
    output_logprobs,
    stream_options_usage,
    token_strings,
    usage_of,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager

MAX_LOGPROBS = 5  # OpenAI's limit for the completions API


class OpenAIServingCompletion:
    def __init__(self, tokenizer_manager: TokenizerManager, served_model_name: str) -> None:
        self.tm = tokenizer_manager
        self.served_model_name = served_model_name

    # ------------------------------------------------------------ request
    @staticmethod
    def _split_prompt(prompt: Any) -> Tuple[bool, Optional[list], Optional[list]]:
        """-> (is_batch, texts, token id lists): exactly one of texts / ids is set."""
        if isinstance(prompt, str):
            return False, [prompt], None
        if not prompt:
            raise RequestError("prompt is empty")
        if all(isinstance(p, str) for p in prompt):
            return True, list(prompt), None
        if all(isinstance(p, int) for p in prompt):
            return False, None, [list(prompt)]
        return True, None, [list(p) for p in prompt]

    def _check(self, req: CompletionRequest) -> None:
        check_common_fields(req)
        if req.suffix:
            raise RequestError("suffix is not supported by this server")
        if req.best_of not in (None, 1):
            raise RequestError(f"best_of must be 1, got {req.best_of}")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {req.logprobs}")

    async def handle(self, req: CompletionRequest, raw: Request):
        self._check(req)
        is_batch, texts, ids = self._split_prompt(req.prompt)
        prompts: List[Any] = texts if texts is not None else ids
        base_rid = new_request_id(req)
        rids = [f"{base_rid}-{i}" for i in range(len(prompts))] if is_batch else [base_rid]
        obj = GenerateReqInput(
            text=(texts if is_batch else texts[0]) if texts is not None else None,
            input_ids=(ids if is_batch else ids[0]) if ids is not None else None,
            sampling_params=build_sampling_params(req, req.max_tokens),
            rid=rids if is_batch else rids[0],
            return_logprob=req.logprobs is not None,
            stream=req.stream,
        )
        first, agen = await start_generation(self.tm, obj, rids, raw)
        model = req.model or self.served_model_name
        echo_prefixes = [self._echo_text(p) if req.echo else "" for p in prompts]
        if not req.stream:
            outs = first if is_batch else [first]
            choices = [
                CompletionChoice(
                    index=i,
                    text=echo_prefixes[i] + out.get("text", ""),
                    logprobs=self._logprobs(out, req.logprobs, 0, 0),
                    finish_reason=finish_reason(out["meta_info"]),
                )
                for i, out in enumerate(outs)
            ]
            resp = CompletionResponse(id=f"cmpl-{base_rid}", model=model, choices=choices, usage=usage_of(outs))
            return JSONResponse(resp.model_dump())
        return StreamingResponse(
            sse_stream(self.tm, rids, first, agen, *self._stream_events(req, base_rid, model, echo_prefixes[0])),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    def _echo_text(self, prompt: Any) -> str:
        if isinstance(prompt, str):
            return prompt
        tok = self.tm.tokenizer
        return tok.decode(prompt) if tok is not None else ""

    # ------------------------------------------------------------ output
    def _logprobs(self, out: dict, k: Optional[int], start: int, text_offset: int) -> Optional[CompletionLogProbs]:
        if k is None:
            return None
        ids, lps = output_logprobs(out, start)
        tokens = token_strings(self.tm.tokenizer, ids)
        offsets = []
        for t in tokens:
            offsets.append(text_offset)
            text_offset += len(t)
        top = [{t: lp} for t, lp in zip(tokens, lps)] if k > 0 else None
        return CompletionLogProbs(tokens=tokens, token_logprobs=lps, top_logprobs=top, text_offset=offsets)

    def _stream_events(self, req: CompletionRequest, rid: str, model: str, echo: str):
        """Callbacks that turn cumulative outputs into OpenAI completion chunks (text deltas)."""
        sent = {"chars": 0, "tokens": 0, "echoed": False}

        def events_for(out: dict) -> List[dict]:
            text = out.get("text", "")
            delta = text[sent["chars"] :]
            lp = self._logprobs(out, req.logprobs, sent["tokens"], sent["chars"])
            fr = finish_reason(out["meta_info"])
            if not sent["echoed"]:
                delta, sent["echoed"] = echo + delta, True
            sent["chars"], sent["tokens"] = max(sent["chars"], len(text)), len(out["output_ids"])
            if not delta and fr is None and not (lp and lp.tokens):
                return []
            choice = CompletionChoice(index=0, text=delta, logprobs=lp, finish_reason=fr)
            return [CompletionResponse(id=f"cmpl-{rid}", model=model, choices=[choice]).model_dump()]

        def closing_events(last: dict) -> List[dict]:
            if not stream_options_usage(req):
                return []
            chunk = CompletionResponse(id=f"cmpl-{rid}", model=model, choices=[], usage=usage_of([last]))
            return [chunk.model_dump()]

        return events_for, closing_events
