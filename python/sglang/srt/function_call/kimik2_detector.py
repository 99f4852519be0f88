"""`kimi_k2`: Kimi K2's call section (special tokens; the call id is `functions.NAME:INDEX`):

<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
"""

from __future__ import annotations

from typing import List

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block, ScannedCall
from sglang.srt.function_call.json_scan import skip_ws, starts, value_end

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def function_name(call_id: str) -> str:
    """`functions.get_weather:0` -> `get_weather`."""
    name = call_id.strip()
    if name.startswith("functions."):
        name = name[len("functions.") :]
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


class KimiK2Detector(BaseFormatDetector):
    start_markers = (SECTION_BEGIN,)
    needs_special_tokens = True

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        calls: List[ScannedCall] = []
        p = j + len(SECTION_BEGIN)
        while True:
            p = skip_ws(text, p)
            begin = starts(text, p, CALL_BEGIN)
            if begin is not True:
                end = starts(text, p, SECTION_END)
                if end is True:
                    return Block("calls", tuple(calls), p + len(SECTION_END))
                if (begin is None or end is None) and not final:
                    return Block("calls", tuple(calls)) if calls else Block("partial")
                return Block("calls", tuple(calls), p) if calls else Block("text")
            q = p + len(CALL_BEGIN)
            a = text.find(ARG_BEGIN, q)
            if a < 0:
                return Block("calls", tuple(calls)) if calls or not final else Block("text")
            name = function_name(text[q:a])
            v = skip_ws(text, a + len(ARG_BEGIN))
            if v == len(text):
                return Block("calls", (*calls, ScannedCall(name, "", False)))
            end = value_end(text, v) if text[v] == "{" else text.find(CALL_END, v)
            if end is None or end < 0:  # JSON arguments stream as they arrive; other text once complete
                return Block("calls", (*calls, ScannedCall(name, text[v:] if text[v] == "{" else "", False)))
            calls.append(ScannedCall(name, text[v:end].rstrip(), True))
            p = skip_ws(text, end)
            close = starts(text, p, CALL_END)
            if close is None and not final:
                return Block("calls", tuple(calls))
            if close:
                p += len(CALL_END)
