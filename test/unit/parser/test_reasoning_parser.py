from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="per-commit-cpu")

# Every --reasoning-parser on outputs written the way its model family writes them: the split into
# reasoning and answer is right, and streaming is exact for every way of cutting the text (seeded random
# chunkings, one character at a time, every prefix).

import random
from typing import List, Tuple

import pytest

from sglang.srt.parser.reasoning_parser import FORMATS, ReasoningParser
from sglang.srt.server_args_cli import REASONING_PARSERS

THINK = "The user wants 2+2.\nThat is 4 — simple: «四».\n"
# format -> [(model output, expected reasoning, expected answer)]
CASES = {
    "qwen3": [
        (f"<think>\n{THINK}</think>\n\nThe answer is 4.", THINK.strip(), "The answer is 4."),
        ("<think>\n\n</think>\n\nNo thinking here.", "", "No thinking here."),
        ("Plain answer with </think> inside.", "", "Plain answer with </think> inside."),
        (f"<think>{THINK}", THINK.strip(), ""),  # cut off while thinking
    ],
    "deepseek-r1": [
        (f"{THINK}</think>\n\nThe answer is 4.", THINK.strip(), "The answer is 4."),  # R1: no opening tag
        (f"<think>\n{THINK}</think>The answer is 4.", THINK.strip(), "The answer is 4."),  # R1-0528
        (f"Still thinking {THINK}", f"Still thinking {THINK}".strip(), ""),
    ],
    "glm45": [
        (f"<think>{THINK}</think>\nThe answer is 4.", THINK.strip(), "The answer is 4."),
        ("<think></think>\nDirect answer.", "", "Direct answer."),
    ],
    "kimi_k2": [
        (f"<think>{THINK}</think>The answer is 4.", THINK.strip(), "The answer is 4."),
        (
            f"<think>{THINK}<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{{}}"
            "<|tool_call_end|><|tool_calls_section_end|>",
            THINK.strip(),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
            "<|tool_call_end|><|tool_calls_section_end|>",
        ),
    ],
}
ALL = [(fmt, i) for fmt, cases in CASES.items() for i in range(len(cases))]


def test_every_flag_name_has_a_format():
    assert tuple(FORMATS) == REASONING_PARSERS and set(CASES) == set(REASONING_PARSERS)


def streamed(fmt: str, chunks: List[str]) -> Tuple[str, str]:
    parser = ReasoningParser(fmt)
    pieces = [parser.parse_stream_chunk(c) for c in chunks] + [parser.finish()]
    return "".join(r for r, _ in pieces), "".join(n for _, n in pieces)


def chunkings(text: str, rng: random.Random, count: int):
    yield list(text)
    yield [text]
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(len(text) - 1, 10)))) if len(text) > 1 else []
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("fmt,index", ALL)
def test_split(fmt, index):
    text, reasoning, answer = CASES[fmt][index]
    assert ReasoningParser(fmt).parse_non_stream(text) == (reasoning, answer)


@pytest.mark.parametrize("fmt,index", ALL)
def test_streaming_is_exact_for_every_chunking_and_prefix(fmt, index):
    text = CASES[fmt][index][0]
    rng = random.Random(f"{fmt}-{index}")
    for end in list(range(0, len(text), 5)) + [len(text)]:
        whole = ReasoningParser(fmt).parse_non_stream(text[:end])
        for chunks in chunkings(text[:end], rng, 30 if end == len(text) else 3):
            assert streamed(fmt, chunks) == whole


def test_reasoning_streams_while_it_is_written():
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("<think>Let me") == ("Let me", "")
    assert parser.parse_stream_chunk(" see </thi") == (" see", "")
    assert parser.parse_stream_chunk("nk> Four.") == ("", "Four.")
