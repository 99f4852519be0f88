"""A chat request as the chat template sees it: messages, tools, template variables; and the tool plan.

Pure functions of the request (no tokenizer): the serving class renders the template with what these
return. Every problem is a RequestError naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, Tool, ToolCallIn
from sglang.srt.managers.tokenizer_manager import RequestError

# apply_chat_template's own arguments: chat_template_kwargs may not set them (they are request fields here).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


@dataclass(frozen=True)
class ToolPlan:
    """What the request asks of tools: those the template renders, and whether calls are parsed."""

    tools: Optional[Tuple[dict, ...]]  # OpenAI tool objects as the template takes them; None: no tools
    parse_calls: bool  # tool_choice "auto" (or forced) with tools: the output's calls become tool_calls
    legacy: bool  # sent as `functions`: calls come back as message.function_call, as OpenAI does
    field: str  # the request field the tools came from ("tools" or "functions"), for error messages
    # tool_choice "required" or a named function (as sent): enforced by a grammar of the parser's call format.
    forced: Optional[Any] = None
    choice_field: str = "tool_choice"


def _message_text(msg: ChatMessage, index: int) -> Optional[str]:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content if msg.content is not None else msg.refusal
    texts = []
    for k, part in enumerate(msg.content):
        if part.type not in ("text", "input_text", "output_text"):
            raise RequestError(f"messages.{index}.content: only text parts are supported, got type {part.type!r}")
        if part.text is None:
            raise RequestError(f"messages.{index}.content.{k}.text: a {part.type} part needs its text (a string)")
        texts.append(part.text)
    return "".join(texts)


def message_text(msg: ChatMessage, index: int) -> str:
    return _message_text(msg, index) or ""


def _arguments_for_template(call: ToolCallIn | Any, where: str) -> Any:
    """Templates index arguments as a mapping (Llama's `| tojson`, Qwen's `is string` test): a JSON object
    text is handed over parsed; other text stays text."""
    text = call.arguments
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise RequestError(f"{where}.arguments: not valid JSON: {text[:80]!r}") from None
    return value


def template_messages(req: ChatCompletionRequest) -> List[Dict[str, Any]]:
    """OpenAI messages -> the dicts chat templates read (tool calls with parsed arguments, tool results)."""
    out: List[Dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        if m.tool_calls and m.role != "assistant":
            raise RequestError(f"messages.{i}.tool_calls: only assistant messages carry tool calls")
        if m.audio is not None:
            raise RequestError(f"messages.{i}.audio: audio is not supported by this server")
        if m.function_call is not None and m.role != "assistant":
            raise RequestError(f"messages.{i}.function_call: only assistant messages carry function calls")
        role = "tool" if m.role == "function" else m.role  # the legacy functions API's result message
        entry: Dict[str, Any] = {"role": role, "content": message_text(m, i)}
        if m.name:
            entry["name"] = m.name
        if m.tool_call_id:
            entry["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            entry["reasoning_content"] = m.reasoning_content
        calls = list(m.tool_calls or [])
        if m.function_call is not None:
            calls.append(ToolCallIn(function=m.function_call))
        if calls:
            entry["tool_calls"] = [
                {
                    "id": c.id or f"call_{i}_{k}",
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments_for_template(c.function, f"messages.{i}.tool_calls.{k}.function"),
                    },
                }
                for k, c in enumerate(calls)
            ]
        out.append(entry)
    return out


def template_kwargs(req: ChatCompletionRequest) -> Dict[str, Any]:
    """add_generation_prompt / continue_final_message and the request's extra template variables."""
    extra = dict(req.chat_template_kwargs or {})
    for key in extra:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise RequestError(
                f"chat_template_kwargs.{key}: reserved; it is set by the request itself "
                "(tools, continue_final_message, ...)"
            )
    if req.continue_final_message:
        last = req.messages[-1].role if req.messages else None
        if last != "assistant":
            raise RequestError(
                "continue_final_message: the last message must be an assistant message (the text to continue), "
                f"got {'no message' if last is None else f'role {last!r}'}"
            )
        return {**extra, "add_generation_prompt": False, "continue_final_message": True}
    return {**extra, "add_generation_prompt": True}


def _check_tools(tools: List[Tool], field: str) -> None:
    names = set()
    for i, tool in enumerate(tools):
        fn = tool.function
        where = f"{field}.{i}" + (".function" if field == "tools" else "")
        if not fn.name:
            raise RequestError(f"{where}.name: must not be empty")
        if fn.name in names:
            raise RequestError(f"{where}.name: {fn.name!r} is defined twice")
        names.add(fn.name)
        if fn.parameters is not None:
            try:
                Draft202012Validator.check_schema(fn.parameters)
            except SchemaError as e:
                path = "".join(f".{p}" for p in e.path)
                raise RequestError(f"{where}.parameters{path}: not a valid JSON schema: {e.message}") from None


def _named_function(choice: Any, field: str) -> Optional[str]:
    """The function name a `{"type": "function", "function": {"name": ...}}` choice (or the legacy
    `{"name": ...}`) names; None for a string choice."""
    if isinstance(choice, str):
        return None
    fn = choice.get("function") if field == "tool_choice" else choice
    if choice.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        shape = '{"type": "function", "function": {"name": ...}}' if field == "tool_choice" else '{"name": ...}'
        raise RequestError(f"{field}: must be 'none', 'auto', 'required' or {shape}, got {json.dumps(choice)}")
    return fn["name"]


def resolve_tools(req: ChatCompletionRequest, parser_name: Optional[str]) -> ToolPlan:
    """Validate tools / tool_choice (or the legacy functions / function_call) and decide what happens."""
    if req.functions is not None and req.tools is not None:
        raise RequestError("functions: give either tools or the legacy functions, not both")
    if req.function_call is not None and req.tool_choice is not None:
        raise RequestError("function_call: give either tool_choice or the legacy function_call, not both")
    legacy = req.functions is not None or req.function_call is not None
    field, choice_field = ("functions", "function_call") if legacy else ("tools", "tool_choice")
    tools = [Tool(function=f) for f in req.functions] if req.functions is not None else list(req.tools or [])
    choice = req.function_call if legacy else req.tool_choice
    _check_tools(tools, field)
    if not tools:
        if choice not in (None, "none"):
            raise RequestError(f"{choice_field}: only allowed when {field} are given")
        return ToolPlan(None, False, legacy, field)
    if choice is None:
        choice = "auto"
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise RequestError(f"{choice_field}: must be 'none', 'auto', 'required' or a function, got {choice!r}")
    named = _named_function(choice, choice_field)
    if named is not None and named not in {t.function.name for t in tools}:
        raise RequestError(f"{choice_field}: function {named!r} is not among the {field}")
    rendered = tuple(t.model_dump(exclude_none=True) for t in tools)
    if choice != "none" and parser_name is None:
        raise RequestError(
            f"{field}: this server was started without --tool-call-parser, so it cannot return tool calls "
            f"({choice_field} 'none' renders the {field} and answers in text)"
        )
    if choice == "required" or named is not None:
        # Enforced by constrained decoding (function_call/tool_choice_grammar.py), in the parser's call format.
        forced = "required" if choice == "required" else {"type": "function", "function": {"name": named}}
        return ToolPlan(rendered, True, legacy, field, forced, choice_field)
    return ToolPlan(rendered, choice == "auto", legacy, field)
