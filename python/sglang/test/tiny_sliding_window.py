"""Tiny random checkpoints with sliding-window layers, written by transformers itself: a Mistral that windows every
layer and a Qwen2 (use_sliding_window, max_window_layers 2) whose upper two of four layers slide, both with a window
of WINDOW tokens, shorter than the test prompts (saved with runners.save_tiny_hf_model)."""

from __future__ import annotations

from sglang.test.runners import TINY_CONFIGS

WINDOW = 12


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
