"""POST /v1/chat/completions: messages -> the tokenizer's chat template -> generation.

The prompt is the template rendered with `add_generation_prompt=True` (or the `--chat-template`
file), tokenized without adding special tokens again (templates already contain BOS where the
model needs it). `logprobs` gives each sampled token's logprob and `top_logprobs` the most likely
tokens at its position, computed in the same forward.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from sglang.srt.constrained.grammar_key import UNSATISFIABLE
from sglang.srt.entrypoints.http_utils import sse_stream, start_generation
from sglang.srt.entrypoints.openai.chat_output import ChatDelta, ChatOutputParser, OutputPlan
from sglang.srt.entrypoints.openai.chat_prompt import (
    ToolPlan,
    message_text,
    resolve_tools,
    template_kwargs,
    template_messages,
)
from sglang.srt.entrypoints.openai.field_policy import check_extra_fields, check_modalities, check_stream_options
from sglang.srt.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogProbs,
    ChatLogProbToken,
    ChatMessageOut,
    ChatStreamChoice,
    DeltaMessage,
    FunctionCallOut,
    ToolCallOut,
)
from sglang.srt.entrypoints.openai.utils import (
    add_constraint,
    build_sampling_params,
    check_sampling_params,
    entry_text,
    finish_reason,
    name_origin,
    new_request_id,
    output_logprob_entries,
    refuse_constraints_when_off,
    renamed_errors,
    response_format_constraint,
    stream_options_usage,
    token_limit_origin,
    usage_of,
    with_origin,
)
from sglang.srt.function_call.tool_choice_grammar import forced_tool_choice_tag
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.parser.reasoning_parser import requires_reasoning
from sglang.srt.utils.chat_template import load_chat_template

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class OpenAIServingChat:
    def __init__(
        self,
        tokenizer_manager: TokenizerManager,
        served_model_name: str,
        chat_template: Optional[str],
        tool_call_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
    ) -> None:
        self.tm = tokenizer_manager
        self.served_model_name = served_model_name
        self.chat_template = load_chat_template(chat_template)
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self._template_renders_tools: Optional[bool] = None

    # ------------------------------------------------------------ request
    def _renders_tools(self) -> bool:
        """Whether the chat template shows tools to the model at all (many small models' templates do not):
        tools it would drop are refused rather than silently ignored. Probed once per server."""
        if self._template_renders_tools is None:
            probe = [{"role": "user", "content": "x"}]
            tool = {"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}
            render = lambda **kw: self.tm.tokenizer.apply_chat_template(  # noqa: E731
                probe, tokenize=False, add_generation_prompt=True, chat_template=self.chat_template, **kw
            )
            try:
                self._template_renders_tools = render(tools=[tool]) != render()
            except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
                self._template_renders_tools = False
        return self._template_renders_tools

    def prompt_ids(self, req: ChatCompletionRequest, plan: ToolPlan) -> List[int]:
        tok = self.tm.tokenizer
        if tok is None:
            raise RequestError("chat completions need a tokenizer; this server runs with --skip-tokenizer-init")
        messages = template_messages(req)
        kwargs = template_kwargs(req)
        if plan.tools is not None:
            if not self._renders_tools():
                raise RequestError(
                    f"{plan.field}: this model's chat template does not render tools, so the model would never "
                    "see them (start the server with a --chat-template that does)"
                )
            kwargs["tools"] = list(plan.tools)
        try:
            text = tok.apply_chat_template(messages, tokenize=False, chat_template=self.chat_template, **kwargs)
        except Exception as e:  # noqa: BLE001 - a template error is the request's (or config's) problem, not a crash
            raise RequestError(f"could not apply the chat template: {type(e).__name__}: {e}") from None
        return tok.encode_prompt(text, add_special_tokens=False)  # every message together must fit the context

    def _check(self, req: ChatCompletionRequest) -> None:
        check_extra_fields(req)
        check_stream_options(req.stream, req.stream_options)
        check_modalities(req.modalities)
        if not req.messages:
            raise RequestError("messages must not be empty")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.top_logprobs}")
        if req.top_logprobs and not req.logprobs:
            raise RequestError("top_logprobs needs logprobs: true")

    def _sampling_params(
        self, req: ChatCompletionRequest, max_tokens: Optional[int], plan: ToolPlan
    ) -> Tuple[dict, Dict[str, str]]:
        """The sampling parameters, and the request field each constraint key came from (for errors)."""
        params = build_sampling_params(req, max_tokens)
        max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        origin: Dict[str, str] = token_limit_origin(max_field)  # errors name the request's fields
        constraint = response_format_constraint(req.response_format)
        if constraint is not None:
            origin[constraint[0]] = "response_format"
        if plan.forced is not None:
            try:
                tag = forced_tool_choice_tag(
                    self.tool_call_parser, plan.tools, plan.forced, req.parallel_tool_calls, plan.choice_field
                )
            except ValueError as e:
                raise RequestError(str(e)) from None
            if constraint is not None:
                raise RequestError(f"{plan.choice_field}: forcing a call cannot be combined with response_format")
            constraint = ("structural_tag", tag)
            origin["structural_tag"] = plan.choice_field
        if constraint is not None:
            add_constraint(params, *constraint, origin.pop(constraint[0]), origin)
        refuse_constraints_when_off(params, origin, self.tm.server_args.grammar_backend)
        check_sampling_params(params, origin)
        return params, origin

    @staticmethod
    def refusal(e: RequestError, origin: Dict[str, str], plan: ToolPlan) -> RequestError:
        """A refusal from the engine naming the request's field (`origin`). A forced call's grammar that no
        output can satisfy names the tool parameters it was built from: the call's fixed text always fits."""
        if plan.forced is not None and e.message.startswith(f"structural_tag: {UNSATISFIABLE}"):
            return RequestError(name_origin(e.message, {"structural_tag": _forced_parameters(plan)}), e.status_code)
        return with_origin(e, origin)

    def _output_plan(self, req: ChatCompletionRequest, plan: ToolPlan) -> OutputPlan:
        return OutputPlan(
            reasoning_parser=self.reasoning_parser if req.separate_reasoning else None,
            tool_call_parser=self.tool_call_parser if plan.parse_calls else None,
            tools=plan.tools or (),
            parallel_tool_calls=req.parallel_tool_calls,
        )

    async def handle(self, req: ChatCompletionRequest, raw: Request):
        self._check(req)
        plan = resolve_tools(req, self.tool_call_parser)
        output_plan = self._output_plan(req, plan)
        rid = new_request_id(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        sampling_params, origin = self._sampling_params(req, max_tokens, plan)
        if output_plan.needs_special_tokens and "skip_special_tokens" not in req.model_fields_set:
            sampling_params["skip_special_tokens"] = False  # the call markers are special tokens
        for i, m in enumerate(req.messages):  # before any template or tokenizer work
            self.tm.check_text_size(message_text(m, i), f"messages.{i}.content")
        obj = GenerateReqInput(
            input_ids=await self.tm.run_cpu(self.prompt_ids, req, plan),
            sampling_params=sampling_params,
            rid=rid,
            return_logprob=req.logprobs,
            top_logprobs_num=req.top_logprobs or 0,
            return_text_in_logprobs=True,
            stream=req.stream,
            require_reasoning=requires_reasoning(self.reasoning_parser, req.chat_template_kwargs or {}),
        )
        try:
            first, agen = await start_generation(self.tm, obj, [rid], raw)
        except RequestError as e:
            raise self.refusal(e, origin, plan) from None
        model = req.model or self.served_model_name
        if not req.stream:
            outs = first if isinstance(first, list) else [first]  # n choices
            choices = [self._choice(i, out, req, plan, output_plan) for i, out in enumerate(outs)]
            resp = ChatCompletionResponse(
                id=f"chatcmpl-{rid}", model=model, choices=choices, usage=usage_of(outs, len(outs))
            )
            body = resp.model_dump()
            for choice in body["choices"]:  # unset message fields are omitted (content stays, null or not)
                choice["message"] = {k: v for k, v in choice["message"].items() if v is not None or k == "content"}
            return JSONResponse(body)
        return StreamingResponse(
            sse_stream(
                self.tm,
                [rid],
                first,
                renamed_errors(agen, lambda e: self.refusal(e, origin, plan)),  # a refusal mid-stream named too
                *self._stream_events(req, rid, model, plan, output_plan),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    def _choice(self, index: int, out: dict, req: ChatCompletionRequest, plan: ToolPlan, output_plan: OutputPlan):
        parser = ChatOutputParser(output_plan)
        parsed = parser.whole(out.get("text", ""))
        calls = [
            ToolCallOut(
                id=parser.call_id(c.tool_index),
                index=c.tool_index,
                function=FunctionCallOut(name=c.name, arguments=c.parameters),
            )
            for c in parsed.tool_calls
        ]
        message = ChatMessageOut(
            content=parsed.content if parsed.content or not calls else None,
            reasoning_content=parsed.reasoning or None,
        )
        if calls and plan.legacy:
            message.function_call = calls[0].function  # the legacy functions API: one call, no id
        elif calls:
            message.tool_calls = calls
        return ChatChoice(
            index=index,
            message=message,
            logprobs=self._logprobs(out, 0) if req.logprobs else None,
            finish_reason=_finish_reason(finish_reason(out["meta_info"]), bool(calls), plan.legacy),
        )

    # ------------------------------------------------------------ output
    def _logprobs(self, out: dict, start: int) -> ChatLogProbs:
        entries, tops = output_logprob_entries(out, start)

        def alternative(e) -> dict:
            text = entry_text(e)
            return {"token": text, "logprob": e[0], "bytes": list(text.encode("utf-8"))}

        return ChatLogProbs(
            content=[
                ChatLogProbToken(
                    token=entry_text(e),
                    logprob=e[0],
                    bytes=list(entry_text(e).encode("utf-8")),
                    top_logprobs=[alternative(t) for t in top],
                )
                for e, top in zip(entries, tops)
            ]
        )

    def _stream_events(self, req: ChatCompletionRequest, rid: str, model: str, plan: ToolPlan, output_plan: OutputPlan):
        """Callbacks: each choice's chunks from its cumulative outputs (`_ChoiceStream`; with n > 1 the choices
        stream interleaved, each chunk naming its choice), then the usage chunk counting every choice."""
        # The chunk's fields as the protocol models dump them, built once per stream: validating the models
        # for every token is a large share of a chunk's cost at hundreds of streams.
        head = ChatCompletionChunk(id=f"chatcmpl-{rid}", model=model, choices=[]).model_dump()
        blank_choice = ChatStreamChoice(index=0, delta=DeltaMessage()).model_dump()
        choices: Dict[int, _ChoiceStream] = {}
        finals: Dict[int, dict] = {}  # per choice: its last output (the usage chunk's counts)

        def chunk(index: int, delta: DeltaMessage, logprobs: Optional[ChatLogProbs], fr: Optional[str]) -> dict:
            choice = dict(
                blank_choice,
                index=index,
                delta=delta.model_dump(exclude_none=True),  # OpenAI omits unset delta fields
                logprobs=None if logprobs is None else logprobs.model_dump(),
                finish_reason=fr,
            )
            return dict(head, choices=[choice])

        def events_for(out: dict) -> List[dict]:
            index = out.get("index", 0)
            finals[index] = out
            if index not in choices:
                logprobs = self._logprobs if req.logprobs else None
                choices[index] = _ChoiceStream(index, req, plan, ChatOutputParser(output_plan), chunk, logprobs)
            return choices[index].events(out)

        def closing_events(_last: dict) -> List[dict]:
            if not stream_options_usage(req):
                return []
            outs = [finals[i] for i in sorted(finals)]  # every choice has had an output
            usage = usage_of(outs, len(outs))  # one prompt, counted once
            return [ChatCompletionChunk(id=f"chatcmpl-{rid}", model=model, choices=[], usage=usage).model_dump()]

        return events_for, closing_events


class _ChoiceStream:
    """One choice of a chat stream: its first chunk carries the role, then reasoning / content / tool-call deltas,
    its last the finish reason. Text its parser still holds back (a marker that may be opening) waits."""

    def __init__(
        self,
        index: int,
        req: ChatCompletionRequest,
        plan: ToolPlan,
        parser: ChatOutputParser,
        chunk: Callable[[int, DeltaMessage, Optional[ChatLogProbs], Optional[str]], dict],
        logprobs: Optional[Callable[[dict, int], ChatLogProbs]],
    ) -> None:
        self.index, self.req, self.plan, self.parser = index, req, plan, parser
        self.chunk, self.logprobs = chunk, logprobs
        self.chars = self.tokens = 0  # sent so far
        self.role_sent = self.called = False
        self.held_reasoning: List[str] = []  # stream_reasoning false: the reasoning goes out in one piece

    def call_pieces(self, items) -> tuple:
        calls, legacy = [], None
        for c in items:
            function = FunctionCallOut(name=c.name, arguments=c.parameters)
            if self.plan.legacy:
                if c.tool_index == 0:
                    legacy = (
                        function
                        if legacy is None
                        else FunctionCallOut(
                            name=legacy.name or c.name, arguments=(legacy.arguments or "") + c.parameters
                        )
                    )
                continue
            first = c.name is not None
            calls.append(
                ToolCallOut(
                    id=self.parser.call_id(c.tool_index) if first else None,
                    index=c.tool_index,
                    type="function" if first else None,
                    function=function,
                )
            )
        return calls or None, legacy

    def events(self, out: dict) -> List[dict]:
        events = []
        if not self.role_sent:
            self.role_sent = True
            events.append(self.chunk(self.index, DeltaMessage(role="assistant", content=""), None, None))
        text = out.get("text", "")
        lp = self.logprobs(out, self.tokens) if self.logprobs is not None else None
        fr = finish_reason(out["meta_info"])
        parsed = self.parser.feed(text[self.chars :]) if len(text) > self.chars else ChatDelta()
        if fr is not None:
            last = self.parser.finish()
            parsed = ChatDelta(
                parsed.reasoning + last.reasoning, parsed.content + last.content, parsed.tool_calls + last.tool_calls
            )
        self.chars, self.tokens = max(self.chars, len(text)), len(out["output_ids"])
        reasoning = parsed.reasoning
        if not self.req.stream_reasoning:
            self.held_reasoning.append(reasoning)
            done = fr is not None or parsed.content or parsed.tool_calls
            reasoning = "".join(self.held_reasoning) if done else ""
            if done:
                self.held_reasoning.clear()
        calls, legacy = self.call_pieces(parsed.tool_calls)
        self.called = self.called or bool(parsed.tool_calls)
        delta = DeltaMessage(
            content=parsed.content or None, reasoning_content=reasoning or None, tool_calls=calls, function_call=legacy
        )
        final = _finish_reason(fr, self.called, self.plan.legacy) if fr is not None else None
        if delta.content or reasoning or calls or legacy or fr is not None or (lp and lp.content):
            events.append(self.chunk(self.index, delta, lp, final))
        return events


def _forced_parameters(plan: ToolPlan) -> str:
    """The field of the parameters a forced call must follow: the named function's, the only tool's, or (with
    several tools under "required") every tool's, written with a `*`."""
    names = [t["function"]["name"] for t in plan.tools or ()]
    if isinstance(plan.forced, dict) and plan.forced["function"]["name"] in names:
        index = str(names.index(plan.forced["function"]["name"]))
    else:
        index = "0" if len(names) == 1 else "*"
    return f"{plan.field}.{index}" + (".function" if plan.field == "tools" else "") + ".parameters"


def _finish_reason(reason: Optional[str], called: bool, legacy: bool) -> Optional[str]:
    """OpenAI's finish reason when the model called tools: tool_calls (function_call for the legacy API)."""
    if called and reason == "stop":
        return "function_call" if legacy else "tool_calls"
    return reason
