"""The detokenizer's tokenizer without transformers: the Rust `tokenizers` backend of an HF fast tokenizer.

The detokenizer only decodes. Loading its tokenizer through transformers imports torch and transformers in that
process (3-4 CPU-seconds of every server start, on 2 cores 3-4 s of start-up), while decoding a plain fast
tokenizer is `backend_tokenizer.decode(ids, skip_special_tokens)` and nothing else. So the launcher, which loads
the tokenizer anyway, writes the backend's JSON to a file when that is all decoding does, and the detokenizer
decodes with `tokenizers` alone. A file, not a process argument: spawn writes the arguments into a pipe, and
megabytes there block the launcher until the child reads them (forever if the child dies first). Any other
tokenizer (a class that overrides decoding, remote code, a clean-up of tokenization spaces that applies) gets None
and the detokenizer loads it through transformers.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, List, Optional


def backend_json_if_plain(tokenizer: Any) -> Optional[str]:
    """`tokenizer`'s backend as JSON when its decode() is exactly the backend's decode, else None."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep the transformers path
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend):
        return None
    if cls.decode is not PreTrainedTokenizerBase.decode or cls._decode is not TokenizersBackend._decode:
        return None
    if _cleans_up_spaces(tokenizer):
        return None
    return tokenizer.backend_tokenizer.to_str()


def write_backend_json(tokenizer: Any) -> Optional[str]:
    """A temporary file holding `tokenizer`'s backend when its decoding is the backend's alone, else None. The
    caller removes it (remove_quietly) once the detokenizer has read it."""
    backend_json = backend_json_if_plain(tokenizer)
    if backend_json is None:
        return None
    fd, path = tempfile.mkstemp(prefix="sglang-detokenizer-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(backend_json)
    return path


def remove_quietly(path: Optional[str]) -> None:
    if path is not None:
        Path(path).unlink(missing_ok=True)


def _cleans_up_spaces(tokenizer: Any) -> bool:
    """Whether TokenizersBackend._decode post-processes the text (clean_up_tokenization, skipped for BPE)."""
    if not tokenizer.clean_up_tokenization_spaces:
        return False
    is_bpe = type(tokenizer.backend_tokenizer.model).__name__ == "BPE"
    force = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return not is_bpe or bool(force)


class BackendDecoder:
    """decode() with the signature the detokenizer calls on an HF tokenizer, on the Rust backend alone."""

    def __init__(self, backend_json: str) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(backend_json)

    @classmethod
    def from_file(cls, path: str) -> "BackendDecoder":
        return cls(Path(path).read_text())

    def decode(
        self,
        ids: List[int],
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,  # fast tokenizers ignore it too
    ) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
