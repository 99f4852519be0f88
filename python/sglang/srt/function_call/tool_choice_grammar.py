"""tool_choice `required` or a named function, enforced by constrained decoding: a structural tag (xgrammar's
own template of each model family's call format) in the format the configured --tool-call-parser reads, so
the output always parses as calls of the allowed tools, with arguments that follow each tool's schema.

The formats are xgrammar's (get_builtin_structural_tag); a unit test checks that each one's output is what
our parser of the same name reads (test/unit/function_call/test_tool_choice_grammar.py).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

# --tool-call-parser -> xgrammar's name of the same call format. mistral and pythonic have none.
XGRAMMAR_FORMATS: Dict[str, str] = {
    "qwen25": "qwen_3",  # Hermes: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
    "llama3": "llama",  # {"name": ..., "parameters": ...}
    "deepseekv3": "deepseek_r1",  # <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json
    "kimi_k2": "kimi",  # <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:i ...
    "qwen3_coder": "qwen_3_coder",  # <tool_call>\n<function=NAME>\n<parameter=k>v</parameter>
    "glm45": "glm_4_7",  # <tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
}


def forced_tool_choice_tag(
    parser: Optional[str], tools: Sequence[dict], choice: Any, parallel_tool_calls: bool, field: str
) -> str:
    """The structural tag (JSON text, SGLang's structural_tag sampling parameter) that makes the model call
    the tools `choice` asks for ("required", or {"type": "function", "function": {"name": ...}}).
    ValueError naming `field` when the parser's format has no grammar."""
    if parser is None:
        raise ValueError(f"{field}: calls are read by a --tool-call-parser; this server was started without one")
    fmt = XGRAMMAR_FORMATS.get(parser)
    if fmt is None:
        raise ValueError(
            f"{field}: forcing calls needs a grammar of the --tool-call-parser {parser} format, which this server "
            f"does not have (it has one for {', '.join(XGRAMMAR_FORMATS)}); use 'auto'"
        )
    import xgrammar as xgr

    tag = xgr.get_builtin_structural_tag(
        fmt,
        tools=[_with_parameters(t) for t in tools],
        tool_choice=choice,
        # The whole output is the call: the reasoning section is not part of the grammar (issue 35 item 3,
        # a grammar from the end of the reasoning on, is not built yet).
        reasoning="disabled",
        parallel_tool_calls=parallel_tool_calls,
    )
    return tag.model_dump_json()


def _with_parameters(tool: dict) -> dict:
    """A tool without `parameters` takes any JSON object as its arguments (OpenAI's rule)."""
    fn = dict(tool["function"])
    fn.setdefault("parameters", {"type": "object"})
    return {"type": "function", "function": fn}
