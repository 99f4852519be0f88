"""`llama3`: Llama 3.1 / 3.2 JSON tool calls, as their chat templates ask for them:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

a JSON object that is the whole answer (from its first character), or that follows `<|python_tag|>`
anywhere; several calls are separated by `;`. A bare JSON answer counts as a call only with both
"name" and "parameters" (or "arguments"), so an ordinary JSON reply stays text.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, held_suffix
from sglang.srt.function_call.core_types import Block, ScannedCall
from sglang.srt.function_call.json_call import parse_json_call
from sglang.srt.function_call.json_scan import WHITESPACE, skip_ws, starts

PYTHON_TAG = "<|python_tag|>"
BARE = "{"  # the marker of a call at the start of the answer


class Llama32Detector(BaseFormatDetector):
    start_markers = (PYTHON_TAG,)
    needs_special_tokens = True

    def find_start(self, text: str, i: int, at_start: bool) -> Optional[Tuple[int, str]]:
        if at_start:
            k = skip_ws(text, i)
            if k < len(text) and text[k] == BARE:
                return k, BARE
        return super().find_start(text, i, at_start)

    def partial_start(self, run: str, at_start: bool) -> int:
        if at_start and not run.strip(WHITESPACE):
            return len(run)  # only whitespace so far: the answer may still open with a call
        return held_suffix(run, self.start_markers)

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        bare = marker == BARE
        calls: List[ScannedCall] = []
        p = j if bare else skip_ws(text, j + len(PYTHON_TAG))
        while True:
            if p == len(text) or text[p] != "{":
                if p == len(text) and not final:
                    return Block("calls", tuple(calls)) if calls else Block("partial")
                return Block("calls", tuple(calls), p) if calls else Block("text")
            found = parse_json_call(text, p, final, commit_on_name=not bare or bool(calls))
            if found.kind != "call":
                if calls:
                    return Block("calls", tuple(calls), None if found.kind == "more" else p)
                return Block("partial" if found.kind == "more" else "text")
            calls.append(found.call)
            if found.end is None:
                return Block("calls", tuple(calls))
            q = skip_ws(text, found.end)
            sep = starts(text, q, ";")
            if sep is None and not final:
                return Block("calls", tuple(calls))
            if not sep:
                return Block("calls", tuple(calls), found.end)
            p = skip_ws(text, q + 1)
