"""The Responses API's output side: the items of a response (reasoning, message, function_call) built from
the parsed text, the stream events that announce them, and the bounded store behind previous_response_id."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any, Dict, List, Optional

from sglang.srt.entrypoints.openai.chat_output import ChatDelta, ChatOutputParser

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


def new_id(prefix: str) -> str:
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
                        "id": new_id("rs"),
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
                        "id": new_id("msg"),
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
                        "id": new_id("fc"),
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


def assistant_turn(items: List[dict]) -> dict:
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
