"""`deepseekv3`: DeepSeek-V3's calls (special tokens), the arguments in a json code block:

<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
```json
{"city": "Paris"}
```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

from typing import List

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block, ScannedCall
from sglang.srt.function_call.json_scan import skip_ws, starts, value_end

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
FENCE_OPEN, FENCE_CLOSE = "```json", "```"


class DeepSeekV3Detector(BaseFormatDetector):
    start_markers = (CALLS_BEGIN,)
    needs_special_tokens = True

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        calls: List[ScannedCall] = []
        p = j + len(CALLS_BEGIN)
        while True:
            p = skip_ws(text, p)
            begin = starts(text, p, CALL_BEGIN)
            if begin is not True:
                end = starts(text, p, CALLS_END)
                if end is True:
                    return Block("calls", tuple(calls), p + len(CALLS_END))
                if (begin is None or end is None) and not final:
                    return Block("calls", tuple(calls)) if calls else Block("partial")
                return Block("calls", tuple(calls), p) if calls else Block("text")
            sep = text.find(SEP, p + len(CALL_BEGIN))
            newline = text.find("\n", sep + len(SEP)) if sep >= 0 else -1
            if newline < 0:  # the name is complete at its line end
                return Block("calls", tuple(calls)) if calls or not final else Block("text")
            name = text[sep + len(SEP) : newline].strip()
            v = skip_ws(text, newline)
            fence = starts(text, v, FENCE_OPEN)
            if fence is None and not final:
                return Block("calls", (*calls, ScannedCall(name, "", False)))
            v = skip_ws(text, v + len(FENCE_OPEN)) if fence else v
            if v == len(text) or text[v] != "{":
                if v == len(text) and not final:
                    return Block("calls", (*calls, ScannedCall(name, "", False)))
                return Block("calls", (*calls, ScannedCall(name, "", False)), None if not final else v)
            end = value_end(text, v)
            if end is None:
                return Block("calls", (*calls, ScannedCall(name, text[v:], False)))
            calls.append(ScannedCall(name, text[v:end], True))
            p = skip_ws(text, end)
            if fence:
                close = starts(text, p, FENCE_CLOSE)
                if close is None and not final:
                    return Block("calls", tuple(calls))
                p = skip_ws(text, p + len(FENCE_CLOSE)) if close else p
            done = starts(text, p, CALL_END)
            if done is None and not final:
                return Block("calls", tuple(calls))
            if done:
                p += len(CALL_END)
