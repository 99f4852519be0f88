"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's decoder with per-head q/k norms before the
rotary embedding, rope parameters per layer type (the sliding layers' `rope_local_base_freq`, the global layers'
theta and scaling), and no attention soft-capping (transformers' Gemma 3 attention never applies
`attn_logit_softcapping`; configs/gemma.py refuses a config that sets it). The final logits keep Gemma 2's cap."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope
from sglang.srt.models.gemma2 import Gemma2Attention, Gemma2DecoderLayer, Gemma2ForCausalLM, Gemma2Model


class Gemma3Attention(Gemma2Attention):
    qk_norm = True

    @staticmethod
    def make_rope(
        config: PretrainedConfig, layer_id: int, head_dim: int, max_position: int, dtype: torch.dtype
    ) -> RotaryEmbedding:
        """The rope of this layer's type (sliding_attention or full_attention)."""
        return get_rope(config, head_dim, max_position, dtype, layer_type=config.layer_types[layer_id])

    @staticmethod
    def attention_logit_cap(config: PretrainedConfig) -> float:
        return 0.0


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls = Gemma3Attention


class Gemma3Model(Gemma2Model):
    layer_cls = Gemma3DecoderLayer


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model


EntryClass = Gemma3ForCausalLM
