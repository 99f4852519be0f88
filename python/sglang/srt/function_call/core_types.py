"""Plain data of tool-call parsing: what a detector finds in a text, and what it streams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class ToolCallItem:
    """One streamed piece of a tool call: the call's first piece carries its name, every piece a slice
    of its arguments (a JSON text); concatenated per tool_index they give the whole call."""

    tool_index: int
    name: Optional[str] = None
    parameters: str = ""


@dataclass(frozen=True)
class StreamingParseResult:
    normal_text: str = ""
    calls: Tuple[ToolCallItem, ...] = ()


@dataclass(frozen=True)
class ScannedCall:
    """A call as far as the text shows it: its name is final once it appears here, and `arguments`
    only ever grows while more text arrives (the detectors guarantee both)."""

    name: str
    arguments: str
    complete: bool


@dataclass(frozen=True)
class Block:
    """What a detector reads from a start marker on.

    kind "calls": the marker opened tool calls; `end` is where the block ends (None: not yet).
    kind "text": the marker is plain text here; normal text continues after it.
    kind "partial": undecided; more text is needed (calls found so far are in `calls`).
    """

    kind: str
    calls: Tuple[ScannedCall, ...] = ()
    end: Optional[int] = None


@dataclass(frozen=True)
class Scan:
    """A detector's reading of a text: normal text and calls, as far as they are certain.

    text[:settled] is read for good: `settled_normal` characters of `normal` and the first
    `settled_calls` calls come from it, and reading text[settled:] on its own gives the rest.
    """

    normal: str
    calls: Tuple[ScannedCall, ...]
    settled: int
    settled_normal: int
    settled_calls: int
