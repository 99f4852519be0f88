"""Shared by the model-runner and post-capture tests: a tiny random Llama checkpoint (2 layers, 2 KV heads)."""

import tempfile

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_model_dir() -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = tempfile.mkdtemp(prefix="tiny-llama-")
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path
