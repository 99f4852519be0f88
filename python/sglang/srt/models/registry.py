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
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "OlmoeForCausalLM": "olmoe",
    "Phi3ForCausalLM": "phi3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v2",  # also Kimi-K2 (model_type kimi_k2)
    "Glm4MoeForCausalLM": "glm4_moe",  # GLM-4.5 / 4.5-Air / 4.6 / 4.7
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",  # text only (model_type gemma3_text)
}


def get_model_class(architecture: str) -> Type[nn.Module]:
    if architecture not in _MODELS:
        raise ValueError(f"model architecture {architecture!r} is not supported (supported: {', '.join(_MODELS)})")
    module = importlib.import_module(f"sglang.srt.models.{_MODELS[architecture]}")
    entry = module.EntryClass
    if isinstance(entry, list):  # a module serving several architectures names each class after one
        return next(cls for cls in entry if cls.__name__ == architecture)
    return entry
