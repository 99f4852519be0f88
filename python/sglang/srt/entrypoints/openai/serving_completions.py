"""POST /v1/completions: OpenAI's legacy completions API on top of the TokenizerManager.

`prompt` may be a string, a list of strings (one choice per prompt), token ids, or a list of
token-id lists. `logprobs=N` gives each sampled token's logprob and the N most likely tokens at its
position (computed in the same forward); with `echo`, the prompt tokens' logprobs come first (the
first prompt token has none, as in OpenAI's API).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from sglang.srt.entrypoints.http_utils import sse_stream, start_generation
from sglang.srt.entrypoints.openai.field_policy import check_extra_fields, check_stream_options
from sglang.srt.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
)
from sglang.srt.entrypoints.openai.utils import (
    add_constraint,
    build_sampling_params,
    check_sampling_params,
    entry_text,
    finish_reason,
    new_request_id,
    output_logprob_entries,
    prompt_logprob_entries,
    refuse_constraints_when_off,
    renamed_errors,
    response_format_constraint,
    stream_options_usage,
    token_limit_origin,
    usage_of,
    with_origin,
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
        check_extra_fields(req)
        check_stream_options(req.stream, req.stream_options)
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
        sampling_params = build_sampling_params(req, req.max_tokens)
        origin: Dict[str, str] = token_limit_origin("max_tokens")  # errors name the request's fields
        constraint = response_format_constraint(req.response_format)
        if constraint is not None:
            add_constraint(sampling_params, *constraint, "response_format", origin)
        refuse_constraints_when_off(sampling_params, origin, self.tm.server_args.grammar_backend)
        check_sampling_params(sampling_params, origin)
        base_rid = new_request_id(req)
        rids = [f"{base_rid}-{i}" for i in range(len(prompts))] if is_batch else [base_rid]
        obj = GenerateReqInput(
            text=(texts if is_batch else texts[0]) if texts is not None else None,
            input_ids=(ids if is_batch else ids[0]) if ids is not None else None,
            sampling_params=sampling_params,
            rid=rids if is_batch else rids[0],
            return_logprob=req.logprobs is not None,
            top_logprobs_num=req.logprobs or 0,
            logprob_start_len=0 if req.echo and req.logprobs is not None else -1,
            return_text_in_logprobs=True,
            stream=req.stream,
        )
        try:
            first, agen = await start_generation(self.tm, obj, rids, raw)
        except RequestError as e:
            raise with_origin(e, origin) from None
        model = req.model or self.served_model_name
        echo_prefixes = [self._echo_text(p) if req.echo else "" for p in prompts]
        if not req.stream:
            outs = first if isinstance(first, list) else [first]  # prompt-major: n choices per prompt
            per_prompt = max(req.n, 1)
            choices = [
                CompletionChoice(
                    index=i,
                    text=echo_prefixes[i // per_prompt] + out.get("text", ""),
                    logprobs=self._logprobs(out, req.logprobs, 0, 0, echo=req.echo),
                    finish_reason=finish_reason(out["meta_info"]),
                )
                for i, out in enumerate(outs)
            ]
            resp = CompletionResponse(
                id=f"cmpl-{base_rid}", model=model, choices=choices, usage=usage_of(outs, per_prompt)
            )
            return JSONResponse(resp.model_dump())
        return StreamingResponse(
            sse_stream(
                self.tm,
                rids,
                first,
                renamed_errors(agen, lambda e: with_origin(e, origin)),  # a refusal mid-stream named too
                *self._stream_events(req, base_rid, model, echo_prefixes),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    def _echo_text(self, prompt: Any) -> str:
        if isinstance(prompt, str):
            return prompt
        tok = self.tm.tokenizer
        return tok.decode(prompt) if tok is not None else ""

    # ------------------------------------------------------------ output
    def _logprobs(
        self, out: dict, k: Optional[int], start: int, text_offset: int, echo: bool = False
    ) -> Optional[CompletionLogProbs]:
        """OpenAI's completion logprobs from output token `start` on; with `echo` the prompt's tokens come
        first, the first of them with null logprob and null alternatives (nothing predicts it), as OpenAI
        returns them. text_offset counts characters from `text_offset` on."""
        if k is None:
            return None
        entries, tops = output_logprob_entries(out, start)
        alternatives: List[Optional[list]] = list(tops)
        if echo:
            prompt, prompt_tops = prompt_logprob_entries(out)
            entries = prompt + entries
            alternatives = list(prompt_tops) + alternatives  # None (null) where nothing predicts the token
        tokens = [entry_text(e) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(text_offset)
            text_offset += len(t)
        top = None
        if k > 0:
            top = [None if alts is None else {entry_text(t): t[0] for t in alts} for alts in alternatives]
        return CompletionLogProbs(
            tokens=tokens, token_logprobs=[e[0] for e in entries], top_logprobs=top, text_offset=offsets
        )

    def _stream_events(self, req: CompletionRequest, rid: str, model: str, echo_prefixes: List[str]):
        """Callbacks that turn cumulative outputs into OpenAI completion chunks (text deltas). Several prompts or
        n > 1 stream every choice interleaved, each chunk naming its choice's index (prompt-major, as without
        stream); the usage chunk counts them all."""
        per_prompt = max(req.n, 1)
        sent: Dict[int, dict] = {}  # per choice: characters and tokens sent, whether the prompt was echoed
        finals: Dict[int, dict] = {}  # per choice: its last output (the usage chunk's counts)
        # The chunk's fields as the protocol models dump them, built once per stream: validating two models
        # per token is a large share of a chunk's cost at hundreds of streams.
        head = CompletionResponse(id=f"cmpl-{rid}", model=model, choices=[]).model_dump()
        blank_choice = CompletionChoice(index=0, text="").model_dump()

        def events_for(out: dict) -> List[dict]:
            index = out.get("index", 0)
            mine = sent.setdefault(index, {"chars": 0, "tokens": 0, "echoed": False})
            finals[index] = out
            echo = echo_prefixes[index // per_prompt]
            text = out.get("text", "")
            delta = text[mine["chars"] :]
            first = not mine["echoed"]
            # The first chunk carries the echoed prompt and, with logprobs, the prompt tokens' entries.
            offset = 0 if first else len(echo) + mine["chars"]
            lp = self._logprobs(out, req.logprobs, mine["tokens"], offset, echo=first and req.echo)
            fr = finish_reason(out["meta_info"])
            if first:
                delta, mine["echoed"] = echo + delta, True
            mine["chars"], mine["tokens"] = max(mine["chars"], len(text)), len(out["output_ids"])
            if not delta and fr is None and not (lp and lp.tokens):
                return []
            choice = dict(
                blank_choice,
                index=index,
                text=delta,
                logprobs=None if lp is None else lp.model_dump(),
                finish_reason=fr,
            )
            return [dict(head, choices=[choice])]

        def closing_events(_last: dict) -> List[dict]:
            if not stream_options_usage(req):
                return []
            outs = [finals[i] for i in sorted(finals)]  # every choice has had an output
            chunk = CompletionResponse(id=f"cmpl-{rid}", model=model, choices=[], usage=usage_of(outs, per_prompt))
            return [chunk.model_dump()]

        return events_for, closing_events
