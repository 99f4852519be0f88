"""Which grammar a request asks for: one of SGLang's constraint fields, as plain data (no xgrammar import)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

# SGLang's sampling_params keys, in the order they are looked at; at most one may be set.
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
# SGLang's json_schema value meaning "any JSON value" (OpenAI's response_format json_object maps to an object).
ANY_JSON = "$$ANY$$"
# The words every refusal of an unsatisfiable constraint carries (at compile time, or a dead end while decoding),
# so the OpenAI layer can tell it from other constraint errors (a forced tool call's then names the tool's
# parameters, where the dead end is).
UNSATISFIABLE = "no output can satisfy it"


@dataclass(frozen=True)
class GrammarKey:
    """A constraint as the cache keys it: the sampling_params field and its text."""

    kind: str  # one of GRAMMAR_KINDS
    text: str


def grammar_key_of(
    json_schema: Optional[str], regex: Optional[str], ebnf: Optional[str], structural_tag: Optional[str]
) -> Optional[GrammarKey]:
    """The one constraint set (None when none is); ValueError naming the fields when several are."""
    given = {k: v for k, v in zip(GRAMMAR_KINDS, (json_schema, regex, ebnf, structural_tag)) if v is not None}
    if len(given) > 1:
        raise ValueError(f"{', '.join(given)}: set at most one constraint per request")
    if not given:
        return None
    ((kind, text),) = given.items()
    return GrammarKey(kind, text)


def schema_text(value: object, field: str) -> str:
    """A json_schema / structural_tag value as JSON text: an object is serialised, a string kept (checked to
    parse as JSON, so a typo is a 400 naming the field before anything is compiled)."""
    if isinstance(value, dict):
        return json.dumps(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a JSON object or its text")
    if field == "json_schema" and value == ANY_JSON:
        return value
    try:
        json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{field} is not valid JSON: {e}") from None
    return value
