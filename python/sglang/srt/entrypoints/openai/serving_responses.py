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
from collections import OrderedDict
from typing import Any, Dict, List, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from sglang.srt.entrypoints.http_utils import error_response, sse_stream, start_generation
from sglang.srt.entrypoints.openai.chat_output import ChatDelta, ChatOutputParser
from sglang.srt.entrypoints.openai.chat_prompt import resolve_tools
from sglang.srt.entrypoints.openai.field_policy import check_extra_fields
from sglang.srt.entrypoints.openai.responses_input import (
    ResponsesRequest,
    check_responses_fields,
    responses_error,
    to_chat_request,
)
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.utils import finish_reason
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager

STORE_CAPACITY = 1024  # responses kept for previous_response_id; the oldest go first


class ResponseStore:
    """Bounded, in memory: response id -> (the response object, the conversation it ends)."""

    def __init__(self, capacity: int = STORE_CAPACITY) -> None:
        self.capacity = capacity
        self._items: "OrderedDict[str, tuple]" = OrderedDict()

    def put(self, response: dict, conversation: List[dict]) -> None:
        self._items[response["id"]] = (response, conversation)
        self._items.move_to_end(response["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> Optional[tuple]:
        return self._items.get(response_id)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """One response's output items, built from parsed deltas in the order they appear, and the events
    that announce them (for a stream)."""

    def __init__(self, parser: ChatOutputParser) -> None:
        self.parser = parser
        self.items: List[dict] = []
        self.open: Optional[int] = None  # the output index of the item being written
        self.calls: Dict[int, int] = {}  # tool index -> output index
        self.events: List[dict] = []

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, **fields})

    def _close(self) -> None:
        if self.open is None:
            return
        item, index = self.items[self.open], self.open
        item["status"] = "completed"
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            self._event(
                "response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text
            )
        elif item["type"] == "message":
            part = item["content"][0]
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            self._event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            )
        else:
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        self._event("response.output_item.done", output_index=index, item=dict(item))
        self.open = None

    def _start(self, item: dict) -> int:
        self._close()
        self.items.append(item)
        self.open = len(self.items) - 1
        announced = dict(item, status="in_progress")
        if item["type"] == "message":
            announced["content"] = []
        elif item["type"] == "reasoning":
            announced["content"] = []
        self._event("response.output_item.added", output_index=self.open, item=announced)
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._event(
                "response.content_part.added", item_id=item["id"], output_index=self.open, content_index=0, part=part
            )
        return self.open

    def add(self, delta: ChatDelta) -> None:
        if delta.reasoning:
            if self.open is None or self.items[self.open]["type"] != "reasoning":
                self._start(
                    {
                        "type": "reasoning",
                        "id": _new_id("rs"),
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}],
                    }
                )
            item = self.items[self.open]
            item["content"][0]["text"] += delta.reasoning
            self._event(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=self.open,
                content_index=0,
                delta=delta.reasoning,
            )
        if delta.content:
            if self.open is None or self.items[self.open]["type"] != "message":
                self._start(
                    {
                        "type": "message",
                        "id": _new_id("msg"),
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}],
                    }
                )
            item = self.items[self.open]
            item["content"][0]["text"] += delta.content
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self.open,
                content_index=0,
                delta=delta.content,
                logprobs=[],
            )
        for call in delta.tool_calls:
            if call.tool_index not in self.calls:
                self.calls[call.tool_index] = self._start(
                    {
                        "type": "function_call",
                        "id": _new_id("fc"),
                        "call_id": self.parser.call_id(call.tool_index),
                        "name": call.name,
                        "arguments": "",
                    }
                )
            index = self.calls[call.tool_index]
            item = self.items[index]
            item["arguments"] += call.parameters
            if call.parameters:
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=call.parameters,
                )

    def finish(self) -> List[dict]:
        self._close()
        return self.items

    def take_events(self) -> List[dict]:
        events, self.events = self.events, []
        return events


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
            sampling_params = self.chat._sampling_params(chat_req, chat_req.max_completion_tokens)
            if output_plan.needs_special_tokens:
                sampling_params["skip_special_tokens"] = False
            input_ids = await self.tm.run_cpu(self.chat.prompt_ids, chat_req, plan)
        except RequestError as e:
            raise responses_error(e) from None
        rid = uuid.uuid4().hex
        obj = GenerateReqInput(input_ids=input_ids, sampling_params=sampling_params, rid=rid, stream=req.stream)
        first, agen = await start_generation(self.tm, obj, [rid], raw)
        response = self._response_head(req, _new_id("resp"))
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
            sse_stream(self.tm, [rid], first, agen, events_for, lambda last: []),
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
            self.store.put(final, conversation + [_assistant_turn(items)])
        return final


def _assistant_turn(items: List[dict]) -> dict:
    """The response's output as the assistant message of the stored conversation."""
    turn: Dict[str, Any] = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "reasoning":
            turn["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "message":
            turn["content"] += item["content"][0]["text"]
        else:
            call = {"name": item["name"], "arguments": item["arguments"]}
            turn.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": call})
    return turn
