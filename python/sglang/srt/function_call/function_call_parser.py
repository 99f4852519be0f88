"""--tool-call-parser: the format names (upstream's) and the detector each one means."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Type

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import StreamingParseResult
from sglang.srt.function_call.deepseekv3_detector import DeepSeekV3Detector
from sglang.srt.function_call.glm4_moe_detector import Glm4MoeDetector
from sglang.srt.function_call.kimik2_detector import KimiK2Detector
from sglang.srt.function_call.llama32_detector import Llama32Detector
from sglang.srt.function_call.mistral_detector import MistralDetector
from sglang.srt.function_call.pythonic_detector import PythonicDetector
from sglang.srt.function_call.qwen3_coder_detector import Qwen3CoderDetector
from sglang.srt.function_call.qwen25_detector import Qwen25Detector

DETECTORS: Dict[str, Type[BaseFormatDetector]] = {
    "qwen25": Qwen25Detector,
    "llama3": Llama32Detector,
    "mistral": MistralDetector,
    "pythonic": PythonicDetector,
    "deepseekv3": DeepSeekV3Detector,
    "glm45": Glm4MoeDetector,
    "kimi_k2": KimiK2Detector,
    "qwen3_coder": Qwen3CoderDetector,
}


class FunctionCallParser:
    """One request's tool-call parsing: `parse_non_stream(text)`, or `parse_stream_chunk(delta)` for
    each streamed piece and `finish()` at the end."""

    def __init__(self, tools: Optional[Sequence[dict]], tool_call_parser: str) -> None:
        if tool_call_parser not in DETECTORS:
            raise ValueError(f"unknown tool-call parser {tool_call_parser!r}; known: {', '.join(DETECTORS)}")
        self.detector = DETECTORS[tool_call_parser](tools)

    def has_tool_call(self, text: str) -> bool:
        return self.detector.has_tool_call(text)

    def parse_non_stream(self, text: str) -> StreamingParseResult:
        return self.detector.detect_and_parse(text)

    def parse_stream_chunk(self, chunk: str) -> StreamingParseResult:
        return self.detector.parse_streaming_increment(chunk)

    def finish(self) -> StreamingParseResult:
        return self.detector.finish()
