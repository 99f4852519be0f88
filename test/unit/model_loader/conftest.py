"""gguf's own reader over the built-in SmolLM2 GGUF, parsed once for the test files here that compare against it
(its pure-Python parse of the 272 tensors and the tokenizer's arrays takes ~3 CPU-s)."""

import gguf
import pytest


@pytest.fixture(scope="session")
def smollm2_gguf_reader() -> gguf.GGUFReader:
    from sglang.test.runners import smollm2_gguf_path

    return gguf.GGUFReader(smollm2_gguf_path())
