"""POST /v1/responses (and GET /v1/responses/{id}): OpenAI's Responses API over the chat path.

The request becomes a chat request (responses_input.py), is generated like one, and its text is read by
the same parsers: reasoning -> a `reasoning` item, the answer -> a `message` item with `output_text`,
tool calls -> `function_call` items. Streaming sends the Responses events (response.created, ...,
response.output_text.delta, response.function_call_arguments.delta, ..., response.completed), whose
pieces join to the items of the final response. Responses with `store` (the default) are kept in a
bounded in-memory store, so `previous_response_id` continues a conversation: the oldest are dropped first
and a dropped or unknown id is a 400 naming the field.
"""

from __future__ import annotations

import time
import uuid
from typing import List

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from sglang.srt.entrypoints.http_utils import error_response, sse_stream, start_generation
from sglang.srt.entrypoints.openai.chat_output import ChatOutputParser
from sglang.srt.entrypoints.openai.chat_prompt import resolve_tools
from sglang.srt.entrypoints.openai.field_policy import check_extra_fields
from sglang.srt.entrypoints.openai.responses_input import (
    ResponsesRequest,
    check_responses_fields,
    responses_error,
    to_chat_request,
)
from sglang.srt.entrypoints.openai.responses_output import ResponseBuilder, ResponseStore, assistant_turn, new_id
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.utils import finish_reason, renamed_errors
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.parser.reasoning_parser import requires_reasoning


class OpenAIServingResponses:
    def __init__(self, tokenizer_manager: TokenizerManager, chat: OpenAIServingChat, served_model_name: str) -> None:
        self.tm = tokenizer_manager
        self.chat = chat
        self.served_model_name = served_model_name
        self.store = ResponseStore()

    def retrieve(self, response_id: str):
        found = self.store.get(response_id)
        if found is None:
            return error_response(f"response {response_id!r} not found (or no longer stored)", 404)
        return found[0]

    async def handle(self, req: ResponsesRequest, raw: Request):
        check_extra_fields(req)
        check_responses_fields(req)
        history: List[dict] = []
        if req.previous_response_id is not None:
            found = self.store.get(req.previous_response_id)
            if found is None:
                raise RequestError(
                    f"previous_response_id: no stored response {req.previous_response_id!r} (unknown, stored with "
                    f"store false, or dropped from the bounded store of {self.store.capacity})"
                )
            history = found[1]
        try:
            chat_req = to_chat_request(req, history)
            plan = resolve_tools(chat_req, self.chat.tool_call_parser)
            output_plan = self.chat._output_plan(chat_req, plan)
            sampling_params, origin = self.chat._sampling_params(chat_req, chat_req.max_completion_tokens, plan)
            if output_plan.needs_special_tokens:
                sampling_params["skip_special_tokens"] = False
            input_ids = await self.tm.run_cpu(self.chat.prompt_ids, chat_req, plan)
        except RequestError as e:
            raise responses_error(e) from None
        rid = uuid.uuid4().hex
        thinks = requires_reasoning(self.chat.reasoning_parser, chat_req.chat_template_kwargs or {})
        obj = GenerateReqInput(
            input_ids=input_ids, sampling_params=sampling_params, rid=rid, stream=req.stream, require_reasoning=thinks
        )
        try:
            first, agen = await start_generation(self.tm, obj, [rid], raw)
        except RequestError as e:  # e.g. a schema that does not compile: named as text.format
            raise responses_error(self.chat.refusal(e, origin, plan)) from None
        response = self._response_head(req, new_id("resp"))
        parser = ChatOutputParser(output_plan)
        conversation = [m.model_dump(exclude_none=True) for m in chat_req.messages]
        if req.instructions:  # instructions apply to this response only, as OpenAI keeps them
            conversation = conversation[1:]
        if not req.stream:
            builder = ResponseBuilder(parser)
            builder.add(parser.whole(first.get("text", "")))
            return JSONResponse(self._complete(req, response, builder.finish(), first, conversation))
        builder = ResponseBuilder(parser)
        sent = {"chars": 0, "seq": 0, "started": False}

        def numbered(events: List[dict]) -> List[dict]:
            for e in events:
                e["sequence_number"] = sent["seq"]
                sent["seq"] += 1
            return events

        def events_for(out: dict) -> List[dict]:
            events: List[dict] = []
            if not sent["started"]:
                sent["started"] = True
                head = dict(response, status="in_progress")
                events += [
                    {"type": "response.created", "response": head},
                    {"type": "response.in_progress", "response": head},
                ]
            text = out.get("text", "")
            if len(text) > sent["chars"]:
                builder.add(parser.feed(text[sent["chars"] :]))
                sent["chars"] = len(text)
            if finish_reason(out["meta_info"]) is not None:
                builder.add(parser.finish())
                items = builder.finish()
                events += builder.take_events()
                final = self._complete(req, response, items, out, conversation)
                kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
                events.append({"type": kind, "response": final})
                return numbered(events)
            return numbered(events + builder.take_events())

        return StreamingResponse(
            sse_stream(
                self.tm,
                [rid],
                first,
                renamed_errors(agen, lambda e: responses_error(self.chat.refusal(e, origin, plan))),  # mid-stream
                events_for,
                lambda last: [],
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    def _response_head(self, req: ResponsesRequest, response_id: str) -> dict:
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": req.model or self.served_model_name,
            "output": [],
            "instructions": req.instructions,
            "tools": req.tools or [],
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "text": req.text or {"format": {"type": "text"}},
            "store": req.store,
            "metadata": req.metadata or {},
            "truncation": "disabled",
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }

    def _complete(
        self, req: ResponsesRequest, response: dict, items: List[dict], out: dict, conversation: list
    ) -> dict:
        meta = out["meta_info"]
        reason = finish_reason(meta)
        prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
        final = dict(
            response,
            output=items,
            status="incomplete" if reason == "length" else "completed",
            incomplete_details={"reason": "max_output_tokens"} if reason == "length" else None,
            usage={
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            },
        )
        if req.store:
            self.store.put(final, conversation + [assistant_turn(items)])
        return final
