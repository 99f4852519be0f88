"""stop_regex (SGLang's sampling parameter): the request stops once its decoded output matches one of the
regular expressions; the text from the match on is trimmed as a stop string's is (kept with no_stop_trim).

Matching uses the `regex` package (re's syntax, and partial matches: while streaming, text that may still
become the start of a match is held back, so the pieces always join to the final, trimmed answer). The
scheduler matches on a decoded tail as long as the longest possible match (one token per character at
worst), or on the whole output when a pattern's matches are unbounded.

A pattern can backtrack catastrophically (e.g. "(=|==)+[^=]" on a run of "="), and the scheduler matches
between decode steps: every search therefore runs under a time budget (SGLANG_STOP_REGEX_TIMEOUT_MS, shared
by all of one request's patterns in one check), and running out raises StopRegexTimeout, which the callers
turn into that request's 400 error: one request's pattern never stalls the others.
"""

from __future__ import annotations

import time
from typing import Iterator, List, Optional, Sequence, Tuple

import regex

from sglang.srt.environ import envs

try:  # the longest possible match of a pattern: re's own parser (private; named sre_parse before 3.11)
    from re import _parser as _sre_parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parser

MAX_STOP_REGEXES = 16
MAX_STOP_REGEX_CHARS = 1024
UNBOUNDED = (1 << 31) - 1  # a tail this long is the whole output


class StopRegexTimeout(ValueError):
    """A stop_regex search ran out of its time budget: the request's pattern is too costly to match."""

    def __init__(self, pattern: str, budget_ms: float) -> None:
        super().__init__(
            f"stop_regex {pattern!r} took longer than {budget_ms:g} ms to match; simplify the pattern "
            "(e.g. avoid nested or overlapping repetition such as (a|aa)+)"
        )


def _searches(patterns: Sequence[str], text: str, **kwargs) -> Iterator[Tuple[str, Optional[regex.Match]]]:
    """(pattern, its match or None) for each pattern in turn, all of them within one time budget, so a check
    costs at most the budget however many patterns a request has; StopRegexTimeout when it runs out."""
    budget_ms = envs.SGLANG_STOP_REGEX_TIMEOUT_MS.get()
    deadline = time.monotonic() + budget_ms / 1000
    for p in patterns:
        try:
            found = regex.search(p, text, timeout=max(deadline - time.monotonic(), 0.0), **kwargs)
        except TimeoutError:
            raise StopRegexTimeout(p, budget_ms) from None
        yield p, found


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
            regex.compile(p)
        except regex.error as e:
            raise ValueError(f"stop_regex: {p!r} does not compile: {e}") from None
        if next(_searches([p], ""))[1] is not None:  # timed, too: lookarounds can be costly even here
            raise ValueError(f"stop_regex: {p!r} matches the empty string, so it would stop every output at once")
    return patterns, max((_max_width(p) for p in patterns), default=0)


def first_match(patterns: Sequence[str], text: str) -> Optional[str]:
    """The first pattern that matches somewhere in `text`; StopRegexTimeout if matching takes too long."""
    return next((p for p, found in _searches(patterns, text) if found is not None), None)


def match_start(pattern: str, text: str) -> Optional[int]:
    """Where `pattern` first matches in `text`; StopRegexTimeout if matching takes too long."""
    _, found = next(_searches([pattern], text))
    return None if found is None else found.start()


def held_back_from(patterns: Sequence[str], text: str, start: int) -> int:
    """Where the text that may still be cut begins, at or after `start` (what is before was sent): the
    earliest match, or partial match reaching the end of `text`, of any pattern. len(text) when none.
    StopRegexTimeout if matching takes too long."""
    held = len(text)
    for _, found in _searches(patterns, text, pos=start, partial=True):
        if found is not None:
            held = min(held, found.start())
    return held
