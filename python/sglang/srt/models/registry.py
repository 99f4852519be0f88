"""HF architecture name -> our model class."""

from __future__ import annotations

import importlib
from typing import Type

from torch import nn

_MODELS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}


def get_model_class(architecture: str) -> Type[nn.Module]:
    if architecture not in _MODELS:
        raise ValueError(f"model architecture {architecture!r} is not supported (supported: {', '.join(_MODELS)})")
    module = importlib.import_module(f"sglang.srt.models.{_MODELS[architecture]}")
    return module.EntryClass
