"""One chat choice's generated text -> reasoning_content, content and tool_calls, streamed or whole.

The text goes through the reasoning parser first (the thinking), then the answer through the tool-call
parser (the calls). Both are exact under streaming, so the deltas a stream sends concatenate to what the
non-streamed message holds. Call ids are made here, one per call, and sent with the call's first piece.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.function_call.function_call_parser import DETECTORS, FunctionCallParser
from sglang.srt.parser.reasoning_parser import FORMATS, ReasoningParser


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: List[ToolCallItem] = field(default_factory=list)


@dataclass(frozen=True)
class OutputPlan:
    """How a request's output is read (decided once per request from the flags and the request)."""

    reasoning_parser: Optional[str]  # None: no reasoning split (no parser, or separate_reasoning false)
    tool_call_parser: Optional[str]  # None: calls are not parsed (no tools, tool_choice none, no parser)
    tools: Sequence[dict] = ()
    parallel_tool_calls: bool = True

    @property
    def needs_special_tokens(self) -> bool:
        """Whether the call markers or reasoning tags are special tokens the detokenizer must keep."""
        calls = self.tool_call_parser is not None and DETECTORS[self.tool_call_parser].needs_special_tokens
        thinking = self.reasoning_parser is not None and FORMATS[self.reasoning_parser].needs_special_tokens
        return calls or thinking


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChatOutputParser:
    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self.reasoning = ReasoningParser(plan.reasoning_parser) if plan.reasoning_parser else None
        self.calls = FunctionCallParser(plan.tools, plan.tool_call_parser) if plan.tool_call_parser else None
        self.call_ids: List[str] = []

    def _keep(self, items: Sequence[ToolCallItem]) -> List[ToolCallItem]:
        # parallel_tool_calls false: the first call only, as OpenAI answers it
        return [c for c in items if self.plan.parallel_tool_calls or c.tool_index == 0]

    def _calls(self, result: StreamingParseResult, out: ChatDelta) -> None:
        out.content += result.normal_text
        out.tool_calls.extend(self._keep(result.calls))

    def feed(self, text: str) -> ChatDelta:
        out = ChatDelta()
        reasoning, answer = self.reasoning.parse_stream_chunk(text) if self.reasoning else ("", text)
        out.reasoning = reasoning
        if self.calls is None:
            out.content = answer
        elif answer:
            self._calls(self.calls.parse_stream_chunk(answer), out)
        return out

    def finish(self) -> ChatDelta:
        out = ChatDelta()
        reasoning, answer = self.reasoning.finish() if self.reasoning else ("", "")
        out.reasoning = reasoning
        if self.calls is None:
            out.content = answer
        else:
            if answer:
                self._calls(self.calls.parse_stream_chunk(answer), out)
            self._calls(self.calls.finish(), out)
        return out

    def call_id(self, index: int) -> str:
        while len(self.call_ids) <= index:
            self.call_ids.append(new_call_id())
        return self.call_ids[index]

    def whole(self, text: str) -> ChatDelta:
        """The non-streamed reading (each call whole, in one item); equal to the streamed pieces joined."""
        reasoning, answer = self.reasoning.parse_non_stream(text) if self.reasoning else ("", text)
        if self.calls is None:
            return ChatDelta(reasoning, answer)
        result = self.calls.parse_non_stream(answer)
        return ChatDelta(reasoning, result.normal_text, self._keep(result.calls))
