"""Tiny random Gemma 2 / Gemma 3 (text) checkpoints written by transformers itself (config.json + model.safetensors,
fp32), with what makes each family differ from Llama switched on: a sliding window shorter than the test prompts,
the final logit soft-cap, Gemma 2's attention soft-cap, an explicit head_dim and query_pre_attn_scalar, tied
embeddings; Gemma 3's layer types and rope per layer type (a small local base, a linearly scaled global rope)."""

from __future__ import annotations

import torch

WINDOW = 10

COMMON = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,  # not hidden / heads
    query_pre_attn_scalar=40,  # the attention scale is 40^-0.5, not head_dim^-0.5
    max_position_embeddings=256,
    sliding_window=WINDOW,
    final_logit_softcapping=2.5,
    tie_word_embeddings=True,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def gemma2_config(**overrides):
    from transformers import Gemma2Config

    # layer_types left to the config: Gemma 2 alternates sliding and full layers.
    return Gemma2Config(**{**COMMON, "attn_logit_softcapping": 1.5, **overrides}, architectures=["Gemma2ForCausalLM"])


def gemma3_config(**overrides):
    from transformers import Gemma3TextConfig

    fields = dict(
        COMMON,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},  # rope_local_base_freq
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        },
    )
    return Gemma3TextConfig(**{**fields, **overrides}, architectures=["Gemma3ForCausalLM"])


GEMMA_CONFIGS = {"gemma2": gemma2_config, "gemma3": gemma3_config}


def write_tiny_gemma(family: str, out_dir: str, seed: int = 0, **overrides) -> str:
    """transformers' own random init of GEMMA_CONFIGS[family] (with overrides), Gemma's norms random too, saved to
    out_dir. Norms are stored as w and scale by 1 + w: w around 2 lets the blocks outweigh the sqrt(hidden)-scaled
    embedding, so that the tied lm_head does not just repeat the last token."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(GEMMA_CONFIGS[family](**overrides), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(2.0 + 0.3 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out_dir)
    return out_dir


def load_reference(path: str, device: str = "cpu", **overrides):
    """transformers' model on these weights (fp32, eval) with its eager attention, the one implementation that
    applies Gemma 2's attention soft-cap in every transformers version: 5.17 (the GPU machine's) picks sdpa for
    Gemma 2 by default and drops the cap, so without this the reference, not the engine, is wrong there."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **overrides)
    return model.to(device).eval()
