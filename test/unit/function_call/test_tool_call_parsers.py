from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=6, suite="per-commit-cpu")

# Every --tool-call-parser format on outputs written the way its model family writes them (several calls,
# text before a call, unicode, JSON nested in arguments, text that only looks like a call): the parse is
# right, and streaming is exact -- for random cuts of the text into chunks (seeded), and for one character
# at a time, the streamed normal text and tool-call pieces concatenate to the non-streamed result.

import json
import random
from typing import List, Tuple

import pytest

from sglang.srt.function_call.function_call_parser import DETECTORS, FunctionCallParser
from sglang.srt.server_args_cli import TOOL_CALL_PARSERS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"type": "object"}, "tags": {"type": "array"}},
            },
        },
    },
]
NESTED = {"query": 'café ☕ "quoted" {braces}', "filters": {"lang": ["fr", "de"], "depth": {"max": 3}}}
W1 = {"city": "Paris", "days": 3}
W2 = {"city": "東京", "unit": "celsius"}

# format -> [(model output, expected normal text, expected calls as (name, arguments))]
CASES = {
    "qwen25": [
        (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            '</tool_call>\n<tool_call>\n{"name": "search", "arguments": '
            + json.dumps(NESTED, ensure_ascii=False)
            + "}\n</tool_call>",
            "Let me check.",
            [("get_weather", W1), ("search", NESTED)],
        ),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius"}}\n</tool_call>',
            "",
            [("get_weather", W2)],
        ),
        ("Use <tool_call> tags like <b>this</b>.", "Use <tool_call> tags like <b>this</b>.", []),
    ],
    "llama3": [
        ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", [("get_weather", W1)]),
        (
            'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "東京", "unit": "celsius"}}; '
            '{"name": "search", "parameters": ' + json.dumps(NESTED, ensure_ascii=False) + "}",
            "Checking.",
            [("get_weather", W2), ("search", NESTED)],
        ),
        ('{"answer": 42, "name": "x"} is JSON.', '{"answer": 42, "name": "x"} is JSON.', []),
    ],
    "mistral": [
        (
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
            '{"name": "search", "arguments": ' + json.dumps(NESTED, ensure_ascii=False) + "}]",
            "",
            [("get_weather", W1), ("search", NESTED)],
        ),
        (
            'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "東京", "unit": "celsius"}'
            "[TOOL_CALLS]search[ARGS]" + json.dumps(NESTED, ensure_ascii=False),
            "Sure.",
            [("get_weather", W2), ("search", NESTED)],
        ),
        ("Lists look like [1, 2].", "Lists look like [1, 2].", []),
    ],
    "pythonic": [
        (
            '[get_weather(city="Paris", days=3), search(query="café ☕ \\"quoted\\" {braces}", '
            'filters={"lang": ["fr", "de"], "depth": {"max": 3}})]',
            "",
            [("get_weather", W1), ("search", NESTED)],
        ),
        ("I will look.\n[get_weather(city='東京', unit='celsius')]", "I will look.", [("get_weather", W2)]),
        (
            "See [the docs](https://x.y) and [1, 2] or [f(x) for x in y].",
            "See [the docs](https://x.y) and [1, 2] or [f(x) for x in y].",
            [],
        ),
    ],
    "deepseekv3": [
        (
            "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n'
            "```json\n" + json.dumps(NESTED, ensure_ascii=False) + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Let me look.",
            [("get_weather", W1), ("search", NESTED)],
        ),
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "東京", "unit": "celsius"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            "",
            [("get_weather", W2)],
        ),
    ],
    "glm45": [
        (
            "Checking both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>search\n"
            '<arg_key>query</arg_key>\n<arg_value>café ☕ "quoted" {braces}</arg_value>\n<arg_key>filters</arg_key>\n'
            '<arg_value>{"lang": ["fr", "de"], "depth": {"max": 3}}</arg_value>\n</tool_call>',
            "Checking both.",
            [("get_weather", W1), ("search", NESTED)],
        ),
        (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>東京</arg_value><arg_key>unit</arg_key>"
            "<arg_value>celsius</arg_value></tool_call>",
            "",
            [("get_weather", W2)],
        ),
    ],
    "kimi_k2": [
        (
            "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
            "<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>"
            + json.dumps(NESTED, ensure_ascii=False)
            + "<|tool_call_end|><|tool_calls_section_end|>",
            "Let me check.",
            [("get_weather", W1), ("search", NESTED)],
        ),
        (
            "<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            '{"city": "東京", "unit": "celsius"}<|tool_call_end|>\n<|tool_calls_section_end|>',
            "",
            [("get_weather", W2)],
        ),
    ],
    "qwen3_coder": [
        (
            "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
            '<parameter=query>\ncafé ☕ "quoted" {braces}\n</parameter>\n<parameter=filters>\n'
            '{"lang": ["fr", "de"], "depth": {"max": 3}}\n</parameter>\n</function>\n</tool_call>',
            "I'll check.",
            [("get_weather", W1), ("search", NESTED)],
        ),
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n<parameter=unit>\ncelsius\n"
            "</parameter>\n</function>\n</tool_call>",
            "",
            [("get_weather", W2)],
        ),
    ],
}
ALL_CASES = [(fmt, i) for fmt, cases in CASES.items() for i in range(len(cases))]


def test_every_flag_name_has_a_detector():
    assert tuple(DETECTORS) == TOOL_CALL_PARSERS and set(CASES) == set(TOOL_CALL_PARSERS)


def non_streamed(fmt: str, text: str) -> Tuple[str, List[Tuple[str, str]]]:
    result = FunctionCallParser(TOOLS, fmt).parse_non_stream(text)
    assert [c.tool_index for c in result.calls] == list(range(len(result.calls)))
    return result.normal_text, [(c.name, c.parameters) for c in result.calls]


def streamed(fmt: str, chunks: List[str]) -> Tuple[str, List[Tuple[str, str]]]:
    parser = FunctionCallParser(TOOLS, fmt)
    normal, calls = "", {}
    for piece in [parser.parse_stream_chunk(c) for c in chunks] + [parser.finish()]:
        normal += piece.normal_text
        for item in piece.calls:
            if item.tool_index not in calls:
                assert item.name, "a call's first piece carries its name"
                assert item.tool_index == len(calls), "calls are announced in order"
                calls[item.tool_index] = [item.name, ""]
            else:
                assert item.name is None, "the name is sent once"
            calls[item.tool_index][1] += item.parameters
    return normal, [tuple(calls[i]) for i in range(len(calls))]


def random_chunks(text: str, rng: random.Random) -> List[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(len(text) - 1, 12))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("fmt,index", ALL_CASES)
def test_parse(fmt, index):
    text, normal, expected = CASES[fmt][index]
    got_normal, got_calls = non_streamed(fmt, text)
    assert got_normal == normal
    assert [(name, json.loads(args)) for name, args in got_calls] == expected


@pytest.mark.parametrize("fmt,index", ALL_CASES)
def test_streaming_equals_non_streaming_for_every_chunking(fmt, index):
    text = CASES[fmt][index][0]
    whole = non_streamed(fmt, text)
    rng = random.Random(f"{fmt}-{index}")
    assert streamed(fmt, list(text)) == whole  # one character at a time
    assert streamed(fmt, [text]) == whole
    for _ in range(150):
        assert streamed(fmt, random_chunks(text, rng)) == whole


@pytest.mark.parametrize("fmt,index", ALL_CASES)
def test_every_prefix_streams_exactly(fmt, index):
    """A text cut off anywhere (max_tokens in the middle of a call) still streams to its non-streamed parse."""
    text = CASES[fmt][index][0]
    rng = random.Random(f"{fmt}-{index}")
    for end in range(0, len(text) + 1, 3):
        prefix = text[:end]
        assert streamed(fmt, random_chunks(prefix, rng) if len(prefix) > 1 else [prefix]) == non_streamed(fmt, prefix)


def test_arguments_stream_before_the_call_ends():
    """JSON arguments are sent as they arrive, not only when the call is complete."""
    parser = FunctionCallParser(TOOLS, "qwen25")
    first = parser.parse_stream_chunk('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert [(c.name, c.parameters) for c in first.calls] == [("get_weather", '{"city": "Pa')]
    more = parser.parse_stream_chunk('ris"}}\n</tool_call>')
    assert [(c.tool_index, c.name, c.parameters) for c in more.calls] == [(0, None, 'ris"}')]


@pytest.mark.parametrize("fmt", TOOL_CALL_PARSERS)
def test_long_answers_stream_in_linear_time(fmt):
    """Streaming re-reads only from the last settled point: 4,000 small chunks of prose stay fast."""
    import time

    text = "A plain answer with some punctuation, (parentheses) and <b>tags</b>; " * 200
    start = time.perf_counter()
    normal, calls = streamed(fmt, [text[i : i + 4] for i in range(0, len(text), 4)])
    assert time.perf_counter() - start < 2.0 and calls == [] and normal == text


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_unknown_parser_is_a_cli_error_listing_the_names(flag, capsys):
    from sglang.srt.server_args import parse_server_args

    with pytest.raises(SystemExit):
        parse_server_args([flag, "no_such_format"])
    err = capsys.readouterr().err
    names = TOOL_CALL_PARSERS if flag == "--tool-call-parser" else ("qwen3", "deepseek-r1", "glm45", "kimi_k2")
    assert flag in err and "no_such_format" in err and all(n in err for n in names)
