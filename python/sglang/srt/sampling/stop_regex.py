"""stop_regex (SGLang's sampling parameter): the request stops once its decoded output matches one of the
regular expressions; the text from the match on is trimmed as a stop string's is (kept with no_stop_trim).

Matching uses the `regex` package (re's syntax, and partial matches: while streaming, text that may still
become the start of a match is held back, so the pieces always join to the final, trimmed answer). The
scheduler matches on a decoded tail as long as the longest possible match (one token per character at
worst), or on the whole output when a pattern's matches are unbounded.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import regex

try:  # the longest possible match of a pattern: re's own parser (private; named sre_parse before 3.11)
    from re import _parser as _sre_parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parser

MAX_STOP_REGEXES = 16
MAX_STOP_REGEX_CHARS = 1024
UNBOUNDED = (1 << 31) - 1  # a tail this long is the whole output


def _max_width(pattern: str) -> int:
    try:
        width = _sre_parser.parse(pattern).getwidth()[1]
    except Exception:  # noqa: BLE001 - syntax only `regex` knows: size unknown, match the whole output
        return UNBOUNDED
    return min(width, UNBOUNDED)


def parse_stop_regex(value: object) -> Tuple[List[str], int]:
    """(the patterns, the longest match any can have in characters); ValueError naming stop_regex."""
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError("stop_regex must be a non-empty string or a list of non-empty strings")
    if len(patterns) > MAX_STOP_REGEXES or any(len(p) > MAX_STOP_REGEX_CHARS for p in patterns):
        raise ValueError(
            f"stop_regex: at most {MAX_STOP_REGEXES} patterns of at most {MAX_STOP_REGEX_CHARS} characters"
        )
    for p in patterns:
        try:
            compiled = regex.compile(p)
        except regex.error as e:
            raise ValueError(f"stop_regex: {p!r} does not compile: {e}") from None
        if compiled.search("") is not None:
            raise ValueError(f"stop_regex: {p!r} matches the empty string, so it would stop every output at once")
    return patterns, max((_max_width(p) for p in patterns), default=0)


def first_match(patterns: Sequence[str], text: str) -> Optional[str]:
    """The first pattern that matches somewhere in `text`."""
    return next((p for p in patterns if regex.search(p, text) is not None), None)


def match_start(pattern: str, text: str) -> Optional[int]:
    found = regex.search(pattern, text)
    return None if found is None else found.start()


def held_back_from(patterns: Sequence[str], text: str, start: int) -> int:
    """Where the text that may still be cut begins, at or after `start` (what is before was sent): the
    earliest match, or partial match reaching the end of `text`, of any pattern. len(text) when none."""
    held = len(text)
    for p in patterns:
        found = regex.search(p, text, pos=start, partial=True)
        if found is not None:
            held = min(held, found.start())
    return held
