"""Small scanners over JSON text that may still be arriving: where a value ends (None: not yet)."""

from __future__ import annotations

from typing import Optional

WHITESPACE = " \t\n\r"


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def starts(text: str, i: int, literal: str) -> Optional[bool]:
    """True: text[i:] starts with `literal`; None: text ends inside a prefix of it; False: neither."""
    rest = text[i : i + len(literal)]
    if rest == literal:
        return True
    return None if literal.startswith(rest) else False


def string_end(text: str, i: int) -> Optional[int]:
    """text[i] is an opening quote: the index after the closing one, or None if the text ends first."""
    quote = text[i]
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> Optional[int]:
    """The index just after the JSON value starting at text[i] (brackets matched outside strings), or
    None while it is incomplete. A scalar ends at the first delimiter after it."""
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c not in "{[":
        j = i
        while j < len(text) and text[j] not in ",}]" + WHITESPACE:
            j += 1
        return j if j < len(text) else None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            end = string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None
