from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# tool_choice "required" / a named function as a grammar: for every --tool-call-parser with a grammar, a call
# written the way its model family writes it is accepted by the grammar AND read by our parser of that name
# (so a constrained output always parses); the grammar refuses text before the call, another function when
# one is named, and arguments outside the tool's schema. Parsers without a grammar are refused by name.

import json

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.function_call.tool_choice_grammar import XGRAMMAR_FORMATS, forced_tool_choice_tag

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: any object
TOOLS = [WEATHER, TIME]
# One call of get_weather(city="Paris") in each family's own format.
CALLS = {
    "qwen25": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "deepseekv3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
}


def grammar(parser: str, choice) -> xgr.Grammar:
    return xgr.Grammar.from_structural_tag(forced_tool_choice_tag(parser, TOOLS, choice, False, "tool_choice"))


def test_every_format_with_a_grammar_has_a_recorded_call():
    assert set(CALLS) == set(XGRAMMAR_FORMATS)


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_the_grammar_accepts_what_the_parser_reads(parser):
    call = CALLS[parser]
    required = grammar(parser, "required")
    assert _is_grammar_accept_string(required, call)
    parsed = FunctionCallParser(TOOLS, parser).parse_non_stream(call)
    assert [(c.name, json.loads(c.parameters)) for c in parsed.calls] == [("get_weather", {"city": "Paris"})]
    assert not _is_grammar_accept_string(required, "Sure! " + call)  # the call comes first
    assert not _is_grammar_accept_string(required, call.replace("city", "town"))  # the required argument
    assert _is_grammar_accept_string(grammar(parser, {"type": "function", "function": {"name": "get_weather"}}), call)
    assert not _is_grammar_accept_string(grammar(parser, {"type": "function", "function": {"name": "get_time"}}), call)


@pytest.mark.parametrize("parser", ["mistral", "pythonic", None])
def test_parsers_without_a_grammar_are_refused_naming_the_field(parser):
    with pytest.raises(ValueError) as e:
        forced_tool_choice_tag(parser, TOOLS, "required", True, "tool_choice")
    assert str(e.value).startswith("tool_choice: ")
