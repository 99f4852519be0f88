"""`glm45`: GLM-4.5's calls, the name and then key/value pairs (values typed by the tool's schema):

<tool_call>get_weather
<arg_key>city</arg_key>
<arg_value>Paris</arg_value>
</tool_call>
"""

from __future__ import annotations

from typing import Any, List, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block, ScannedCall
from sglang.srt.function_call.json_scan import skip_ws, starts
from sglang.srt.function_call.param_types import arguments_text, typed_value

BOT, EOT = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class Glm4MoeDetector(BaseFormatDetector):
    start_markers = (BOT,)

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        p = skip_ws(text, j + len(BOT))
        if p == len(text):
            return Block("text" if final else "partial")
        ends = [k for k in (text.find("\n", p), text.find(KEY, p), text.find(EOT, p)) if k >= 0]
        if not ends:  # the name is complete at its line end (or the first key, or the end tag)
            return Block("text" if final else "partial")
        name = text[p : min(ends)].strip()
        if not name or "<" in name:
            return Block("text")
        schema = self.parameter_schema(name)
        params: List[Tuple[str, Any]] = []
        p = min(ends)
        while True:
            p = skip_ws(text, p)
            key = starts(text, p, KEY)
            if key is not True:
                close = starts(text, p, EOT)
                if close is True:
                    return Block("calls", (ScannedCall(name, arguments_text(params, True), True),), p + len(EOT))
                if (key is None or close is None) and not final:
                    return Block("calls", (ScannedCall(name, arguments_text(params, False), False),))
                return Block("calls", (ScannedCall(name, arguments_text(params, True), final),), p)
            k_end = text.find(KEY_END, p)
            v_start = text.find(VALUE, k_end) if k_end >= 0 else -1
            v_end = text.find(VALUE_END, v_start) if v_start >= 0 else -1
            if v_end < 0:
                return Block("calls", (ScannedCall(name, arguments_text(params, final), False),))
            k = text[p + len(KEY) : k_end].strip()
            raw = text[v_start + len(VALUE) : v_end]
            params.append((k, typed_value(raw, schema.get(k, {}))))
            p = v_end + len(VALUE_END)
