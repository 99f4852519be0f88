"""Arguments of the formats that write parameters as text (GLM-4.5's arg_key/arg_value pairs, Qwen3-Coder's
<parameter=...> tags): each value is typed by the tool's JSON schema, and the arguments JSON text is built
parameter by parameter, so it only ever grows while the call streams."""

from __future__ import annotations

import ast
import json
from typing import Any, List, Tuple


def _types(schema: dict) -> List[str]:
    kind = schema.get("type")
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    return [kind] if isinstance(kind, str) else []


def typed_value(raw: str, schema: dict) -> Any:
    """A parameter's text as the value its schema asks for: strings stay text; anything else is read as
    JSON (or a Python literal, as models write `True`), and stays text when it is neither."""
    kinds = _types(schema)
    if kinds == ["string"]:
        return raw
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (str, int, float, bool, list, dict)) or value is None:
            if not kinds or "string" not in kinds or not isinstance(value, str):
                return value
    return raw


def arguments_text(params: List[Tuple[str, Any]], closed: bool) -> str:
    """The arguments JSON as far as `params` go: exactly json.dumps of the dict once closed."""
    body = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in params)
    if closed:
        return "{" + body + "}"
    return "{" + body if params else ""
