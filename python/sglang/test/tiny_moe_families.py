"""Tiny random checkpoints written by transformers itself (config.json + model.safetensors, fp32) for the
architectures of models/{mixtral, qwen2_moe, olmoe, glm4_moe, phi3, qwen3_moe}.py. Each config sets what its family has
that the others do not, so a missed detail changes the greedy tokens:

- mixtral: 4 experts top-2, renormalised; the checkpoint's block_sparse_moe / w1 w2 w3 names.
- qwen2_moe: q/k/v bias, a shared expert and its sigmoid gate, norm_topk_prob false, layer 1 dense
  (mlp_only_layers).
- olmoe: q/k norms over the whole projection, clip_qkv, no renormalisation.
- glm4_moe: partial rotary, qk-norm, attention bias, sigmoid grouped routing with a non-zero correction bias,
  routed_scaling_factor, a shared expert, one leading dense layer.
- phi3: fused qkv_proj / gate_up_proj in the checkpoint, partial rotary (Phi-4-mini's).
- qwen3_moe: q/k norms per head, head_dim apart from hidden_size / heads, renormalised top-k (the config-field
  tests set its sliding window and decoder_sparse_step).
"""

from __future__ import annotations

import os
from typing import Dict

import torch

_ATTN = dict(
    vocab_size=256,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

TINY_FAMILIES: Dict[str, dict] = {
    "mixtral": dict(_ATTN, intermediate_size=64, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(
        _ATTN,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_hidden_layers=3,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        mlp_only_layers=[1],
    ),
    "olmoe": dict(
        _ATTN,
        intermediate_size=32,
        num_hidden_layers=2,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        clip_qkv=3.0,
    ),
    "glm4_moe": dict(
        _ATTN,
        intermediate_size=96,
        moe_intermediate_size=32,
        head_dim=32,
        num_hidden_layers=3,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        attention_bias=True,
        use_qk_norm=True,
        num_nextn_predict_layers=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
    "qwen3_moe": dict(
        _ATTN,
        intermediate_size=96,
        moe_intermediate_size=32,
        head_dim=32,
        num_hidden_layers=3,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=True,
    ),
    "phi3": dict(
        _ATTN,
        intermediate_size=96,
        num_hidden_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
    ),
}


def tiny_family_config(family: str, **overrides):
    import transformers

    cls = {
        "mixtral": transformers.MixtralConfig,
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "olmoe": transformers.OlmoeConfig,
        "glm4_moe": transformers.Glm4MoeConfig,
        "phi3": transformers.Phi3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
    }[family]
    return cls(**{**TINY_FAMILIES[family], **overrides})


def make_tiny_family(family: str, out_dir: str, seed: int = 0, init_std: float = 0.08, **overrides):
    """Write a tiny random `family` checkpoint to `out_dir`; returns (out_dir, the transformers model).

    transformers' own init with a larger std (peaked next-token distributions); norms, biases, routers and
    correction biases get random values too, so a loader that skipped any of them would be caught."""
    from transformers import AutoModelForCausalLM

    config = tiny_family_config(family, initializer_range=init_std, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight"):  # routers and Qwen2-MoE's shared-expert gate
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir, model.eval()
