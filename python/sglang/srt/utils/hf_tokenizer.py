"""Tokenizers from HF directories and GGUF files; a GGUF's converted tokenizer is cached on disk.

Converting a GGUF vocabulary takes transformers several seconds; every process (tokenizer manager,
scheduler, detokenizer) needs the tokenizer, so the first conversion is saved and reused.
"""

from __future__ import annotations

import hashlib
import logging
import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from sglang.srt.model_loader.model_source import resolve_tokenizer_source

logger = logging.getLogger(__name__)


def _cache_dir(gguf_path: str) -> str:
    st = os.stat(gguf_path)
    key = hashlib.sha256(f"{os.path.abspath(gguf_path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "sglang-postcap", "gguf-tokenizers", key)


def get_tokenizer(tokenizer_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """`trust_remote_code` (--trust-remote-code): a tokenizer shipping its own Python code may run it."""
    source = resolve_tokenizer_source(tokenizer_path)
    if source.kind == "hf":
        try:
            return AutoTokenizer.from_pretrained(source.path, trust_remote_code=trust_remote_code)
        except ValueError as e:
            if trust_remote_code or "trust_remote_code" not in str(e):
                raise
            raise ValueError(
                f"--tokenizer-path {tokenizer_path}: this tokenizer ships its own Python code; pass "
                "--trust-remote-code to run it, or --skip-tokenizer-init to send token ids"
            ) from e
    cache = _cache_dir(source.path)
    if os.path.isfile(os.path.join(cache, "tokenizer_config.json")):
        try:
            return AutoTokenizer.from_pretrained(cache)
        except (OSError, ValueError) as e:  # a broken cache is rebuilt, never fatal
            logger.warning("Rebuilding the cached GGUF tokenizer at %s: %s", cache, e)
    tok = AutoTokenizer.from_pretrained(source.directory, gguf_file=source.gguf_file)
    try:
        tmp = f"{cache}.tmp{os.getpid()}"
        tok.save_pretrained(tmp)
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        os.replace(tmp, cache) if not os.path.exists(cache) else None
    except OSError as e:
        logger.warning("Could not cache the GGUF tokenizer (%s); it will be converted again next time", e)
    return tok
