"""`qwen25`: Hermes-style calls, as Qwen2.5 / Qwen3 chat templates ask for them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, text may precede the first one.
"""

from __future__ import annotations

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block
from sglang.srt.function_call.json_call import parse_json_call
from sglang.srt.function_call.json_scan import skip_ws, starts

BOT, EOT = "<tool_call>", "</tool_call>"


class Qwen25Detector(BaseFormatDetector):
    start_markers = (BOT,)

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        p = skip_ws(text, j + len(BOT))
        if p == len(text):
            return Block("text" if final else "partial")
        if text[p] != "{":
            return Block("text")
        found = parse_json_call(text, p, final)
        if found.kind != "call":
            return Block("text" if found.kind == "none" else "partial")
        if found.end is None:
            return Block("calls", (found.call,))
        q = skip_ws(text, found.end)
        closing = starts(text, q, EOT)
        if closing is None and not final:
            return Block("calls", (found.call,))  # the end tag is still arriving
        return Block("calls", (found.call,), q + len(EOT) if closing else found.end)
