"""`mistral`: Mistral's `[TOOL_CALLS]` control token followed by a JSON list of calls,

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]

or, from the v11 tokenizer on, by one call per marker: `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`.
"""

from __future__ import annotations

from typing import List

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block, ScannedCall
from sglang.srt.function_call.json_call import parse_json_call
from sglang.srt.function_call.json_scan import skip_ws, starts, value_end

BOT, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class MistralDetector(BaseFormatDetector):
    start_markers = (BOT,)
    needs_special_tokens = True

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        p = skip_ws(text, j + len(BOT))
        if p == len(text):
            return Block("text" if final else "partial")
        if text[p] == "[":
            return self._json_list(text, p, final)
        return self._compact(text, p, final)

    def _json_list(self, text: str, p: int, final: bool) -> Block:
        calls: List[ScannedCall] = []
        p += 1
        while True:
            p = skip_ws(text, p)
            if p == len(text):
                return Block("calls", tuple(calls)) if calls or not final else Block("text")
            if text[p] == "]":
                return Block("calls", tuple(calls), p + 1) if calls else Block("text")
            if text[p] != "{":
                return Block("calls", tuple(calls), p) if calls else Block("text")
            found = parse_json_call(text, p, final)
            if found.kind != "call":
                if calls:
                    return Block("calls", tuple(calls), None if found.kind == "more" else p)
                return Block("partial" if found.kind == "more" else "text")
            calls.append(found.call)
            if found.end is None:
                return Block("calls", tuple(calls))
            p = skip_ws(text, found.end)
            sep = starts(text, p, ",")
            if sep is None and not final:
                return Block("calls", tuple(calls))
            if sep:
                p += 1

    def _compact(self, text: str, p: int, final: bool) -> Block:
        a = text.find(ARGS, p)
        if a < 0:
            return Block("text" if final else "partial")
        name = text[p:a].split(CALL_ID)[0].strip()
        v = skip_ws(text, a + len(ARGS))
        if v == len(text):
            return Block("calls", (ScannedCall(name, "", False),))
        if text[v] != "{":
            return Block("calls", (ScannedCall(name, "", False),), None if not final else v)
        end = value_end(text, v)
        if end is None:
            return Block("calls", (ScannedCall(name, text[v:], False),))
        return Block("calls", (ScannedCall(name, text[v:end], True),), end)
