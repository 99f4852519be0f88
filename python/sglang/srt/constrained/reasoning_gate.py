"""When a request's grammar starts: after the model's reasoning, as upstream SGLang does.

A thinking model (--reasoning-parser) writes free text first and ends it with the format's end tag
(`</think>`); a constraint (json_schema, a forced tool call, ...) applies from the token after that tag on.
The tag is matched as the token ids the tokenizer gives it (one added token on Qwen3, DeepSeek-R1, GLM-4.5,
Kimi-K2); the same text spelled with other tokens does not end the reasoning.
"""

from __future__ import annotations

from typing import Tuple


class ReasoningGate:
    """Open (the grammar applies) once `end_ids` were accepted in a row; open from the start when empty."""

    def __init__(self, end_ids: Tuple[int, ...]) -> None:
        self.end_ids = end_ids
        self.open = not end_ids
        self._matched = 0  # how many leading tokens of end_ids the reasoning's last tokens are

    def accept(self, token: int) -> None:
        """A reasoning token (only called while closed); opens the gate when it completes the end tag."""
        ends = self.end_ids
        if token == ends[self._matched]:
            self._matched += 1
        else:
            # the longest prefix of the tag the tokens now end with (the tag may overlap itself)
            seen = ends[: self._matched] + (token,)
            self._matched = next((k for k in range(len(seen), 0, -1) if seen[-k:] == ends[:k]), 0)
        if self._matched == len(ends):
            self.open = True


def reasoning_end_ids(tokenizer, end_tag: str) -> Tuple[int, ...]:
    """The token ids of a reasoning format's end tag as the tokenizer writes it on its own."""
    return tuple(tokenizer.encode(end_tag, add_special_tokens=False))
