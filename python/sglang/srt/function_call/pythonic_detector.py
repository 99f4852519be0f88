"""`pythonic`: calls as a Python list of calls with keyword arguments (Llama 3.2 / 4's pythonic format):

    [get_weather(city="Paris"), get_time(zone="CET")]

A list counts only when it is complete and every element is such a call with literal arguments; until
its closing bracket arrives nothing of it is sent (its arguments are only known then).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Optional

from sglang.srt.function_call.base_format_detector import BaseFormatDetector
from sglang.srt.function_call.core_types import Block, ScannedCall

START = "["
# What may follow "[" for it to open a call list; a text prefix of this may still become one.
_OPENING = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_OPENING_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?$")


def _list_end(text: str, i: int) -> Optional[int]:
    """The index after the bracket closing text[i] == "[", skipping Python strings; None: not yet."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c in "'\"":
            k = j + 1
            while k < len(text) and text[k] != c:
                k += 2 if text[k] == "\\" else 1
            if k >= len(text):
                return None
            j = k + 1
            continue
        if c in "[({":
            depth += 1
        elif c in "])}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _call_name(func: ast.expr) -> Optional[str]:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        head = _call_name(func.value)
        return None if head is None else f"{head}.{func.attr}"
    return None


def parse_call_list(source: str) -> Optional[tuple]:
    """`[f(a=1), g()]` -> the calls, or None when it is not a list of calls with literal keyword arguments."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for element in tree.body.elts:
        if not isinstance(element, ast.Call) or element.args:
            return None
        name = _call_name(element.func)
        if name is None or any(kw.arg is None for kw in element.keywords):
            return None
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in element.keywords}
            text = json.dumps(args, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        calls.append(ScannedCall(name, text, True))
    return tuple(calls)


class PythonicDetector(BaseFormatDetector):
    start_markers = (START,)

    def parse_block(self, text: str, j: int, marker: str, final: bool) -> Block:
        if not _OPENING.match(text, j):
            maybe = _OPENING_PREFIX.match(text[j:]) is not None
            return Block("partial" if maybe and not final else "text")
        end = _list_end(text, j)
        if end is None:
            return Block("text" if final else "partial")
        calls = parse_call_list(text[j:end])
        return Block("calls", calls, end) if calls else Block("text")
