"""A call written as a JSON object, `{"name": ..., "arguments": {...}}` (Hermes, Llama 3, Mistral), read
from text that may still be arriving.

The usual key order (name first, then arguments or parameters) streams: the name as soon as its string
closes, then the arguments' JSON text as it appears, verbatim. Any other shape is read once the whole
object has arrived (its arguments re-serialized), so nothing sent before is ever revised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from sglang.srt.function_call.core_types import ScannedCall
from sglang.srt.function_call.json_scan import skip_ws, starts, string_end, value_end

ARGUMENT_KEYS = ('"arguments"', '"parameters"')


@dataclass(frozen=True)
class JsonCall:
    """kind: "call" (call set; end None while the object is open), "more" (undecided), "none" (not a call)."""

    kind: str
    call: Optional[ScannedCall] = None
    end: Optional[int] = None


def _whole_object(text: str, i: int, final: bool, committed_name: Optional[str], strict: bool = False) -> JsonCall:
    """The call read from the complete object (`strict`: only with an arguments or parameters key)."""
    end = value_end(text, i)
    if end is None:
        if committed_name is not None:
            return JsonCall("call", ScannedCall(committed_name, "", False))
        return JsonCall("none" if final else "more")
    try:
        obj = json.loads(text[i:end])
    except ValueError:
        obj = None
    name = obj.get("name") if isinstance(obj, dict) else None
    if committed_name is not None and name != committed_name:
        name = committed_name  # a repeated "name" key: the first one was sent already
    if not isinstance(name, str) or (strict and not ({"arguments", "parameters"} & set(obj))):
        return JsonCall("none")
    args = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else {}
    if isinstance(args, str):  # arguments sent as a JSON string, as some models do
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return JsonCall("call", ScannedCall(name, json.dumps(args, ensure_ascii=False), True), end)


def parse_json_call(text: str, i: int, final: bool, commit_on_name: bool = True) -> JsonCall:
    """Read the call object starting at text[i] == "{". `commit_on_name`: a complete name string makes
    it a call (inside a call marker); otherwise the arguments key must follow too (bare JSON)."""
    strict = not commit_on_name
    p = skip_ws(text, i + 1)
    has_name = starts(text, p, '"name"')
    if has_name is None:
        return JsonCall("none" if final else "more")
    if has_name is False:
        return _whole_object(text, i, final, None, strict)
    p = skip_ws(text, p + len('"name"'))
    colon = starts(text, p, ":")
    if colon is not True:
        return JsonCall("more") if colon is None and not final else _whole_object(text, i, final, None, strict)
    p = skip_ws(text, p + 1)
    if p == len(text):
        return JsonCall("none" if final else "more")
    if text[p] != '"':
        return _whole_object(text, i, final, None, strict)
    name_end = string_end(text, p)
    if name_end is None:
        return JsonCall("none" if final else "more")
    try:
        name = json.loads(text[p:name_end])
    except ValueError:
        return JsonCall("none")
    committed = name if commit_on_name else None
    p = skip_ws(text, name_end)
    comma = starts(text, p, ",")
    if comma is None:
        if committed is not None:
            return JsonCall("call", ScannedCall(name, "", False))
        return JsonCall("none" if final else "more")
    if comma is False:
        if text[p] == "}" and committed is not None:  # a call without arguments
            return JsonCall("call", ScannedCall(name, "{}", True), p + 1)
        return _whole_object(text, i, final, committed, strict)
    p = skip_ws(text, p + 1)
    key = next((k for k in ARGUMENT_KEYS if starts(text, p, k)), None)
    if key is None:
        if any(starts(text, p, k) is None for k in ARGUMENT_KEYS):  # the key is still arriving
            if committed is not None:
                return JsonCall("call", ScannedCall(name, "", False))
            return JsonCall("none" if final else "more")
        return _whole_object(text, i, final, committed, strict)
    p = skip_ws(text, p + len(key))
    colon = starts(text, p, ":")
    v = skip_ws(text, p + 1) if colon else p
    if colon is not True or v == len(text):
        if colon is False:
            return _whole_object(text, i, final, committed)
        if committed is not None:
            return JsonCall("call", ScannedCall(name, "", False))
        return JsonCall("none" if final else "more")
    if text[v] != "{":
        return _whole_object(text, i, final, name)  # e.g. arguments as a string: read it whole
    args_end = value_end(text, v)
    if args_end is None:  # the arguments stream verbatim while they arrive
        return JsonCall("call", ScannedCall(name, text[v:], False))
    call = ScannedCall(name, text[v:args_end], True)
    p = skip_ws(text, args_end)
    close = starts(text, p, "}")
    if close is True:
        return JsonCall("call", call, p + 1)
    if close is None:
        return JsonCall("call", call)
    end = value_end(text, i)  # more keys after the arguments: the object ends where its braces do
    return JsonCall("call", call, end)
