"""The base of every tool-call format: one reading of the text serves both streaming and not.

A format implements `find_start` (where a call block may begin) and `parse_block` (what the block holds
so far). From those, `scan(text, final)` reads the whole text deterministically, and:

- `detect_and_parse(text)` is `scan(text, final=True)`;
- `parse_streaming_increment(chunk)` scans what arrived so far and sends only what grew since the last
  call: new normal text, a new call's name, more of a call's arguments; `finish()` sends the rest.

So the streamed pieces concatenate to the non-streamed result for every way the text is cut, provided
each scan of a prefix only ever extends (never revises) what the scan of a longer text finds. The formats
keep that promise by deciding nothing before the text decides it: a name is sent once it is complete,
arguments as they appear (JSON text) or parameter by parameter (formats that build the JSON), and text
that might open a call is held back until it is known. Whitespace next to a call block is not normal
text. Scanning restarts from the last settled point, so a long answer is not re-read at every chunk.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from sglang.srt.function_call.core_types import Block, Scan, ScannedCall, StreamingParseResult, ToolCallItem
from sglang.srt.function_call.json_scan import WHITESPACE, skip_ws


class StreamingInvariantError(RuntimeError):
    """A scan revised what an earlier scan had already sent: a detector bug, never input-dependent."""


def held_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker (it may become one)."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


class BaseFormatDetector:
    """Subclasses set `start_markers` and implement parse_block (and find_start if a marker is not a
    fixed string). `tools` are the request's OpenAI tools (some formats type parameters by their schema)."""

    start_markers: Tuple[str, ...] = ()
    # Formats whose markers are special tokens need the detokenizer to keep them in the text.
    needs_special_tokens: bool = False

    def __init__(self, tools: Optional[Sequence[dict]] = None) -> None:
        self.tools = list(tools or [])
        self._buffer = ""
        self._base = 0  # the settled offset in _buffer the next scan starts from
        self._index_base = 0  # calls settled before _base
        self._sent_normal = ""  # normal text sent from the current segment
        self._sent_calls: List[Tuple[str, str]] = []  # (name, arguments) sent per call of the segment

    # ------------------------------------------------------------ format hooks
    def find_start(self, text: str, i: int, at_start: bool) -> Optional[Tuple[int, str]]:
        """The first place at or after i where a call block may begin, and its marker."""
        found = [(text.find(m, i), m) for m in self.start_markers]
        found = [(j, m) for j, m in found if j >= 0]
        return min(found) if found else None

    def partial_start(self, run: str, at_start: bool) -> int:
        """How many trailing characters of a normal run must wait (they may begin a marker)."""
        return held_suffix(run, self.start_markers)

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        raise NotImplementedError

    def parameter_schema(self, function_name: str) -> Dict[str, dict]:
        """The JSON schema of each parameter of a request tool (empty when unknown)."""
        for tool in self.tools:
            fn = tool.get("function", tool)
            if fn.get("name") == function_name:
                return dict((fn.get("parameters") or {}).get("properties") or {})
        return {}

    # ------------------------------------------------------------ reading
    def scan(self, text: str, final: bool, at_start: bool = True) -> Scan:
        normal: List[str] = []
        calls: List[ScannedCall] = []
        settled = (0, 0, 0)
        i = 0
        while True:
            start = self.find_start(text, i, at_start and i == 0)
            if start is None:
                run = text[i:]
                if not final:
                    run = run[: len(run) - self.partial_start(run, at_start and i == 0)].rstrip(WHITESPACE)
                normal.append(run)
                settled = (i + len(run), sum(map(len, normal)), len(calls))
                break
            j, marker = start
            block = self.parse_block(text, j, marker, final)
            if block.kind == "text":  # the marker is ordinary text here
                normal.append(text[i : j + len(marker)])
                i = j + len(marker)
                continue
            normal.append(text[i:j].rstrip(WHITESPACE))
            calls.extend(block.calls)
            if block.kind == "partial" or block.end is None:
                break
            k = skip_ws(text, block.end)
            if k == len(text):
                break  # the whitespace after a block may be followed by more: settle later
            settled = (k, sum(map(len, normal)), len(calls))
            i = k
        return Scan("".join(normal), tuple(calls), *settled)

    def detect_and_parse(self, text: str) -> StreamingParseResult:
        s = self.scan(text, final=True)
        return StreamingParseResult(
            s.normal, tuple(ToolCallItem(i, c.name, c.arguments) for i, c in enumerate(s.calls))
        )

    def has_tool_call(self, text: str) -> bool:
        return bool(self.scan(text, final=True).calls)

    # ------------------------------------------------------------ streaming
    def parse_streaming_increment(self, text_chunk: str) -> StreamingParseResult:
        self._buffer += text_chunk
        return self._advance(final=False)

    def finish(self) -> StreamingParseResult:
        """The end of the text: whatever was held back (a marker that never completed) goes out."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> StreamingParseResult:
        s = self.scan(self._buffer[self._base :], final, at_start=self._base == 0)
        if not s.normal.startswith(self._sent_normal):
            raise StreamingInvariantError(f"normal text revised: {self._sent_normal!r} -> {s.normal!r}")
        normal_delta = s.normal[len(self._sent_normal) :]
        items: List[ToolCallItem] = []
        for k, call in enumerate(s.calls):
            if k < len(self._sent_calls):
                name, args = self._sent_calls[k]
                if call.name != name or not call.arguments.startswith(args):
                    raise StreamingInvariantError(f"call {k} revised: {(name, args)!r} -> {call!r}")
                if len(call.arguments) > len(args):
                    items.append(ToolCallItem(self._index_base + k, None, call.arguments[len(args) :]))
            else:
                items.append(ToolCallItem(self._index_base + k, call.name, call.arguments))
        if len(s.calls) < len(self._sent_calls):
            raise StreamingInvariantError("a call that was sent disappeared")
        self._sent_normal = s.normal[s.settled_normal :]
        self._sent_calls = [(c.name, c.arguments) for c in s.calls[s.settled_calls :]]
        self._base += s.settled
        self._index_base += s.settled_calls
        return StreamingParseResult(normal_delta, tuple(items))
