"""`qwen3_coder`: Qwen3-Coder's XML-style calls (values typed by the tool's schema):

<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
</function>
</tool_call>
"""

from __future__ import annotations

from typing import Any, List, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block, ScannedCall
from sglang.srt.function_call.json_scan import skip_ws, starts
from sglang.srt.function_call.param_types import arguments_text, typed_value

BOT, EOT = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


def _strip_one_newline(value: str) -> str:
    """The template writes each value on its own lines: one newline on either side is layout."""
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value


class Qwen3CoderDetector(BaseFormatDetector):
    start_markers = (BOT,)

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        p = skip_ws(text, j + len(BOT))
        fn = starts(text, p, FUNCTION)
        if fn is not True:
            return Block("partial" if fn is None and not final else "text")
        name_end = text.find(">", p)
        if name_end < 0:
            return Block("text" if final else "partial")
        name = text[p + len(FUNCTION) : name_end].strip()
        schema = self.parameter_schema(name)
        params: List[Tuple[str, Any]] = []
        p = name_end + 1
        while True:
            p = skip_ws(text, p)
            param = starts(text, p, PARAMETER)
            if param is not True:
                done = starts(text, p, FUNCTION_END)
                if done is True:
                    call = ScannedCall(name, arguments_text(params, True), True)
                    q = skip_ws(text, p + len(FUNCTION_END))
                    closing = starts(text, q, EOT)
                    if closing is None and not final:
                        return Block("calls", (call,))
                    return Block("calls", (call,), q + len(EOT) if closing else p + len(FUNCTION_END))
                if (param is None or done is None) and not final:
                    return Block("calls", (ScannedCall(name, arguments_text(params, False), False),))
                return Block("calls", (ScannedCall(name, arguments_text(params, True), final),), p)
            key_end = text.find(">", p)
            value_end = text.find(PARAMETER_END, key_end) if key_end >= 0 else -1
            if value_end < 0:
                return Block("calls", (ScannedCall(name, arguments_text(params, final), False),))
            key = text[p + len(PARAMETER) : key_end].strip()
            raw = _strip_one_newline(text[key_end + 1 : value_end])
            params.append((key, typed_value(raw, schema.get(key, {}))))
            p = value_end + len(PARAMETER_END)
