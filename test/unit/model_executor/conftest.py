"""Shared by the model-runner and post-capture tests: a tiny random Llama checkpoint (2 layers, 2 KV heads)."""

import tempfile

import pytest


@pytest.fixture(scope="module")
def tiny_model_dir() -> str:
    from sglang.test.runners import make_tiny_hf_model

    return make_tiny_hf_model(
        "llama", tempfile.mkdtemp(prefix="tiny-llama-"), vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
