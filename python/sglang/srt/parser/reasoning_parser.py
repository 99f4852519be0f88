"""--reasoning-parser: a thinking model's reasoning, split from its answer (`reasoning_content` / `content`).

    qwen3        <think> ... </think> answer        (reasoning only when the output opens with <think>)
    deepseek-r1  [<think>] ... </think> answer      (R1 may omit the opening tag: reasoning from the start)
    glm45        <think> ... </think> answer
    kimi_k2      <think> ... </think> answer        (a tool-call section also ends the reasoning)

One state machine reads the text, streamed or whole (`parse_non_stream` feeds it the text in one piece),
and it never sends what a later character could change: a partial tag and trailing whitespace wait. So
the streamed pieces concatenate to the non-streamed result for every way the text is cut. The reasoning
is stripped of surrounding whitespace, and so is the start of the answer after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from sglang.srt.function_call.base_format_detector import held_suffix

WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    force_reasoning: bool  # reasoning from the first character, with or without the start tag
    implicit_ends: Tuple[str, ...] = ()  # text that ends the reasoning and stays in the answer
    needs_special_tokens: bool = False  # its tags are special tokens: the detokenizer must keep them
    # The chat-template variable that turns thinking off when false (None: the model always thinks).
    thinking_switch: Optional[str] = None


FORMATS: Dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat("<think>", "</think>", False, thinking_switch="enable_thinking"),
    "deepseek-r1": ReasoningFormat("<think>", "</think>", True),
    "glm45": ReasoningFormat("<think>", "</think>", False, thinking_switch="enable_thinking"),
    "kimi_k2": ReasoningFormat("<think>", "</think>", False, ("<|tool_calls_section_begin|>",), True),
}


def requires_reasoning(model_type: Optional[str], template_kwargs: Dict[str, Any]) -> bool:
    """Whether a chat request's answer starts with reasoning (so a constraint applies after it): a reasoning
    parser is set and the request does not turn thinking off through the format's template variable."""
    if model_type is None:
        return False
    switch = FORMATS[model_type].thinking_switch
    return switch is None or template_kwargs.get(switch, True) is not False


class ReasoningParser:
    """One request's reasoning split: `parse_non_stream(text)`, or `parse_stream_chunk(chunk)` per
    streamed piece and `finish()` at the end; each returns (reasoning delta, answer delta)."""

    def __init__(self, model_type: str, force_reasoning: bool = False) -> None:
        if model_type not in FORMATS:
            raise ValueError(f"unknown reasoning parser {model_type!r}; known: {', '.join(FORMATS)}")
        self.fmt = FORMATS[model_type]
        self.force = force_reasoning or self.fmt.force_reasoning
        self._buf = ""
        self._pos = 0  # the first character of _buf not yet sent (or decided away)
        self._phase = "start"  # start -> reasoning -> answer, or start -> answer
        self._reasoning_sent = False
        self._strip_answer = False  # the answer follows a reasoning block: its leading whitespace goes

    def parse_non_stream(self, text: str) -> Tuple[str, str]:
        r1, n1 = self.parse_stream_chunk(text)
        r2, n2 = self.finish()
        return r1 + r2, n1 + n2

    def parse_stream_chunk(self, chunk: str) -> Tuple[str, str]:
        self._buf += chunk
        return self._advance(final=False)

    def finish(self) -> Tuple[str, str]:
        return self._advance(final=True)

    # ------------------------------------------------------------ the machine
    def _advance(self, final: bool) -> Tuple[str, str]:
        reasoning = ""
        if self._phase == "start" and not self._decide_start(final):
            return "", ""
        if self._phase == "reasoning":
            reasoning = self._reasoning(final)
        answer = self._answer(final) if self._phase == "answer" else ""
        return reasoning, answer

    def _decide_start(self, final: bool) -> bool:
        rest = self._buf[self._pos :].lstrip(WHITESPACE)
        if rest.startswith(self.fmt.start):
            self._phase = "reasoning"
            self._pos = len(self._buf) - len(rest) + len(self.fmt.start)
            return True
        if self.fmt.start.startswith(rest) and not final:
            return False  # empty, or the start tag still arriving
        self._phase = "reasoning" if self.force else "answer"
        return True

    def _reasoning(self, final: bool) -> str:
        ends = (self.fmt.end, *self.fmt.implicit_ends)
        found = [(k, m) for m in ends if (k := self._buf.find(m, self._pos)) >= 0]
        if found:
            k, marker = min(found)
            piece = self._emit_reasoning(self._buf[self._pos : k].rstrip(WHITESPACE))
            self._phase, self._strip_answer = "answer", True
            self._pos = k + (len(marker) if marker == self.fmt.end else 0)
            return piece
        limit = len(self._buf) if final else len(self._buf) - held_suffix(self._buf[self._pos :], ends)
        body = self._buf[self._pos : limit].rstrip(WHITESPACE)  # trailing whitespace waits
        piece = self._emit_reasoning(body)
        return piece

    def _emit_reasoning(self, body: str) -> str:
        start = self._pos
        if not self._reasoning_sent:
            stripped = body.lstrip(WHITESPACE)
            start += len(body) - len(stripped)
            body = stripped
        if body:
            self._reasoning_sent = True
        self._pos = start + len(body)
        return body

    def _answer(self, final: bool) -> str:
        text = self._buf[self._pos :]
        if self._strip_answer:
            stripped = text.lstrip(WHITESPACE)
            self._pos += len(text) - len(stripped)
            text = stripped
            if text:
                self._strip_answer = False
        self._pos += len(text)
        return text
