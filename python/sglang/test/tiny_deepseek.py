"""Tiny random DeepSeek-V2 / V3 checkpoints written by transformers itself (config.json + model.safetensors, fp32),
for the MLA / DeepSeekMoE tests. Each exercises what its family has that the other does not:

- "v2": DeepSeek-V2-Lite's layout: q_lora_rank null (q_proj), softmax greedy top-k, routed_scaling_factor != 1,
  two shared experts, one dense layer first.
- "v3": q_lora_rank set (q_a_proj / q_a_layernorm / q_b_proj), noaux_tc grouped top-k (n_group / topk_group)
  with a non-zero e_score_correction_bias, norm_topk_prob, routed_scaling_factor 2.5, YaRN rope whose
  mscale_all_dim changes the softmax scale, interleaved rope.
"""

from __future__ import annotations

import os
from typing import Dict

import torch

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)

TINY_DEEPSEEK: Dict[str, dict] = {
    "v2": dict(
        _COMMON,
        q_lora_rank=None,
        topk_method="greedy",
        n_shared_experts=2,
        routed_scaling_factor=1.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "v3": dict(
        _COMMON,
        q_lora_rank=48,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_interleave=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    ),
}


def tiny_deepseek_config(version: str, **overrides):
    from transformers import DeepseekV2Config, DeepseekV3Config

    cls = {"v2": DeepseekV2Config, "v3": DeepseekV3Config}[version]
    return cls(**{**TINY_DEEPSEEK[version], **overrides})


def make_tiny_deepseek(version: str, out_dir: str, seed: int = 0, init_std: float = 0.08, **overrides):
    """Write a tiny random DeepSeek-`version` checkpoint ("v2" or "v3") to `out_dir`; returns (out_dir, model).

    Weights are transformers' own init with a larger std (peaked next-token distributions: greedy does not
    hinge on last-bit differences); norms, the router and (V3) the correction bias get random values, so a
    loader that skipped any of them would be caught."""
    from transformers import AutoModelForCausalLM

    config = tiny_deepseek_config(version, initializer_range=init_std, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir, model.eval()
