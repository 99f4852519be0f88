"""What the OpenAI endpoints do with keys their request models do not declare: none is silently ignored.

- OpenAI's label and hint fields, which leave the answer unchanged (`user`, `metadata`, `service_tier`,
  prompt-cache hints, `prediction`), are accepted;
- fields of features this server does not run (OpenAI's audio output, web search, reasoning effort,
  stored completions; SGLang's LoRA, priority scheduling, sessions, ...) are accepted only at their
  default (null / false / empty, as clients send them) and are otherwise a 400 naming the field;
- anything else is a 400 naming the field, so a typo or another server's extension never passes for
  an answer it did not shape.
"""

from __future__ import annotations

from typing import Dict, Mapping, Tuple

from pydantic import BaseModel

from sglang.srt.entrypoints.native_protocol import UNSUPPORTED_FIELDS, is_default
from sglang.srt.managers.tokenizer_manager import RequestError

# OpenAI fields that only label the request or hint at caching / speed: the completion is the same.
LABEL_FIELDS: Tuple[str, ...] = (
    "user",
    "metadata",
    "safety_identifier",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "prediction",
)
# OpenAI fields whose features this server does not have -> what the 400 calls them.
OPENAI_UNSUPPORTED: Dict[str, str] = {
    "audio": "audio output",
    "web_search_options": "web search",
    "verbosity": "verbosity control",
    "reasoning_effort": "reasoning effort control",
    "moderation": "moderation",
    "store": "stored completions",
}


def _unsupported_fields() -> Mapping[str, str]:
    # SGLang's OpenAI adapter accepts /generate's extension fields too; those of features we lack are
    # refused the same way there and here (native_protocol.UNSUPPORTED_FIELDS).
    return {**UNSUPPORTED_FIELDS, **OPENAI_UNSUPPORTED}


def check_extra_fields(req: BaseModel) -> None:
    """Raise a 400 naming the first undeclared key that is neither a label nor at its default."""
    unsupported = _unsupported_fields()
    for name, value in (req.__pydantic_extra__ or {}).items():
        if name in LABEL_FIELDS:
            continue
        if name in unsupported:
            if not is_default(value):
                raise RequestError(
                    f"{name}: {unsupported[name]} is not supported by this server (send null or omit it)"
                )
            continue
        raise RequestError(f"{name}: unknown field; this server does not know it, so it would have no effect")


def check_stream_options(stream: bool, stream_options: object) -> None:
    """stream_options shape a stream only: with `stream` false they are a 400, as OpenAI (and vLLM) answer."""
    if stream_options is not None and not stream:
        raise RequestError("stream_options: only allowed when stream is true")


def check_modalities(modalities) -> None:
    if modalities not in (None, [], ["text"]):
        raise RequestError(f"modalities: only text output is supported by this server, got {modalities}")
