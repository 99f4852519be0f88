"""The Responses API's request (`POST /v1/responses`) translated into a chat request.

Input items become chat messages (text messages, function_call items as an assistant's tool calls,
function_call_output items as tool messages, reasoning items as the next assistant turn's reasoning),
function tools become chat tools, `text.format` becomes `response_format`; the chat path then renders,
checks and generates. Errors name the Responses field (`text.format`, `tools.0.parameters`, ...).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from sglang.srt.entrypoints.http_utils import describe_validation_errors
from sglang.srt.entrypoints.native_protocol import is_default
from sglang.srt.entrypoints.openai.field_policy import check_stream_options
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.managers.tokenizer_manager import RequestError

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
# Responses fields of features this server does not run -> what the 400 calls them (null / default is fine).
RESPONSES_UNSUPPORTED = {
    "background": "background responses",
    "conversation": "stored conversations",
    "prompt": "stored prompts",
    "max_tool_calls": "tool-call limits",
    "top_logprobs": "logprobs in responses",
    "include": "extra output (include)",
    "context_management": "context management",
    "image": "image inputs",
}
# Values of those fields that ask for nothing beyond is_default's (a count of 0: no alternatives asked for).
RESPONSES_UNUSED_VALUES = {"top_logprobs": (0,)}


class ResponsesStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_obfuscation: Optional[bool] = None  # a transport hint (protocol.StreamOptions): no padding is added


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared keys: field_policy.check_extra_fields

    model: Optional[str] = None
    input: Union[str, List[Dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: bool = True
    text: Optional[Dict[str, Any]] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stream: bool = False
    previous_response_id: Optional[str] = None
    store: bool = True
    metadata: Optional[Dict[str, str]] = None
    reasoning: Optional[Dict[str, Any]] = None
    truncation: Optional[str] = None
    stream_options: Optional[ResponsesStreamOptions] = None
    # Features this server lacks: accepted at their default, a 400 naming them otherwise.
    background: Optional[Any] = None
    conversation: Optional[Any] = None
    prompt: Optional[Any] = None
    max_tool_calls: Optional[Any] = None
    top_logprobs: Optional[Any] = None
    include: Optional[Any] = None
    context_management: Optional[Any] = None
    image: Optional[Any] = None


def check_responses_fields(req: ResponsesRequest) -> None:
    check_stream_options(req.stream, req.stream_options)
    values = req.model_dump(include=set(RESPONSES_UNSUPPORTED))
    for name, feature in RESPONSES_UNSUPPORTED.items():
        if not is_default(values[name]) and values[name] not in RESPONSES_UNUSED_VALUES.get(name, ()):
            raise RequestError(f"{name}: {feature} are not supported by this server (send null or omit it)")
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        raise RequestError("reasoning: reasoning effort / summary control is not supported by this server")
    if req.truncation not in (None, "disabled"):
        raise RequestError(f"truncation: only 'disabled' is supported, got {req.truncation!r}")


def _text_of(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}: must be a string or a list of content parts")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.{k}: only text parts are supported, got type {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _reasoning_text(item: Dict[str, Any], where: str) -> str:
    """A reasoning item's text: its content (reasoning_text parts), then its summary (summary_text parts). Each
    is a list of parts in OpenAI's API; anything else is a 400 naming it (not a TypeError, a 500)."""
    texts = []
    for name in ("content", "summary"):
        parts = item.get(name)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise RequestError(f"{where}.{name}: must be a list of text parts, got {type(parts).__name__}")
        texts.append(_text_of(parts, f"{where}.{name}"))
    return "".join(texts)


def input_messages(items: Union[str, List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Responses input -> chat messages (the shape ChatCompletionRequest takes)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: List[Dict[str, Any]] = []
    reasoning: List[str] = []

    def assistant() -> Dict[str, Any]:
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": None}
            messages.append(last)
        if reasoning:
            last["reasoning_content"] = "".join(reasoning)
            reasoning.clear()
        return last

    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{where}.role: must be user, system, developer or assistant, got {role!r}")
            text = _text_of(item.get("content"), f"{where}.content")
            if role == "assistant":
                msg = assistant()
                msg["content"] = (msg["content"] or "") + text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments") or ""}
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item, where))
        else:
            raise RequestError(
                f"{where}.type: {kind!r} items are not supported (message, function_call, function_call_output, "
                "reasoning)"
            )
    return messages


def _chat_tool(tool: Dict[str, Any], i: int) -> Dict[str, Any]:
    if tool.get("type") != "function":
        raise RequestError(f"tools.{i}.type: only function tools are supported, got {tool.get('type')!r}")
    unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
    if unknown:
        raise RequestError(f"tools.{i}.{sorted(unknown)[0]}: unknown field")
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(f"tool_choice: must be 'none', 'auto', 'required' or a function, got {choice}")


def _response_format(text: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    for key, value in (text or {}).items():
        if key == "verbosity" and value not in (None, "medium"):  # OpenAI's default, the only one we answer with
            raise RequestError(f"text.verbosity: verbosity control is not supported by this server, got {value!r}")
        if key not in ("format", "verbosity"):
            raise RequestError(f"text.{key}: unknown field; this server does not know it, so it would have no effect")
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError('text.format: must be an object such as {"type": "json_schema", "schema": ...}')
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return fmt


# Chat field names in error messages -> the Responses names they came from.
_RENAMES = [
    (re.compile(r"^response_format\.json_schema"), "text.format"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^tools\.(\d+|\*)\.function\."), r"tools.\1."),
    (re.compile(r"^messages\.\d+"), "input"),
    (re.compile(r"^max_new_tokens"), "max_output_tokens"),
    (re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),  # the chat field it is sent as
]


def responses_error(e: RequestError) -> RequestError:
    message = e.message
    for pattern, name in _RENAMES:
        message = pattern.sub(name, message)
    return RequestError(message, e.status_code)


def to_chat_request(req: ResponsesRequest, history: List[Dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that runs this response: instructions, then the earlier turns, then the input."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history
    messages += input_messages(req.input)
    if not messages:
        raise RequestError("input: must not be empty")
    body: Dict[str, Any] = {
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "stream": req.stream,
        "response_format": _response_format(req.text),
    }
    if req.tools is not None:
        body["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise responses_error(RequestError(describe_validation_errors(e.errors()))) from None
