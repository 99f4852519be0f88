"""Tiny random checkpoints with sliding-window layers, written by transformers itself: a Mistral that windows every
layer and a Qwen2 (use_sliding_window, max_window_layers 2) whose upper two of four layers slide, both with a window
of WINDOW tokens, shorter than the test prompts."""

from __future__ import annotations

import torch

from sglang.test.runners import TINY_CONFIGS

WINDOW = 12


def write_tiny(out_dir: str, config) -> str:
    """transformers' own random init (std 0.08, random norms, as runners.make_tiny_hf_model) saved to out_dir."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out_dir)
    return out_dir


def mistral_config(window: int = WINDOW):
    from transformers import MistralConfig

    base = {k: v for k, v in TINY_CONFIGS["llama"].items() if k != "architectures"}
    return MistralConfig(**base, sliding_window=window, initializer_range=0.08, architectures=["MistralForCausalLM"])


def qwen2_config():
    from transformers import Qwen2Config

    base = {k: v for k, v in TINY_CONFIGS["qwen2"].items() if k != "architectures"}
    base["num_hidden_layers"] = 4
    return Qwen2Config(
        **base,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=2,
        initializer_range=0.08,
        architectures=["Qwen2ForCausalLM"],
    )
