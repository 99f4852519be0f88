"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2 attention (q/k/v bias), sparse layers of routed experts
(softmax top-k, renormalised with norm_topk_prob) plus one shared expert scaled by sigmoid(shared_expert_gate(x))
(transformers' Qwen2MoeSparseMoeBlock); `decoder_sparse_step` / `mlp_only_layers` leave some layers dense."""

from __future__ import annotations

from typing import Optional

import torch
from transformers import PretrainedConfig

from sglang.srt.models.llama import LlamaAttention, LlamaModel
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM, is_sparse_layer
from sglang.srt.models.sparse_moe import SparseMoeDecoderLayer, SparseMoeShape


class Qwen2MoeAttention(LlamaAttention):
    def __init__(
        self, config: PretrainedConfig, layer_id: int, dtype: torch.dtype, max_position: int, quantization=None
    ):
        # Qwen2-MoE configs say whether q/k/v carry a bias (qkv_bias, true in every released checkpoint); o_proj never.
        self.qkv_bias = bool(getattr(config, "qkv_bias", True))
        super().__init__(config, layer_id, dtype, max_position, quantization)


class Qwen2MoeDecoderLayer(SparseMoeDecoderLayer):
    attention_cls = Qwen2MoeAttention

    @staticmethod
    def moe_shape(config: PretrainedConfig, layer_id: int) -> Optional[SparseMoeShape]:
        if not is_sparse_layer(config, layer_id):
            return None
        return SparseMoeShape(
            hidden_size=config.hidden_size,
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            expert_intermediate_size=config.moe_intermediate_size,
            renormalize=bool(config.norm_topk_prob),
            shared_expert_intermediate_size=config.shared_expert_intermediate_size,
        )


class Qwen2MoeModel(LlamaModel):
    layer_cls = Qwen2MoeDecoderLayer


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    model_cls = Qwen2MoeModel


EntryClass = Qwen2MoeForCausalLM
