"""OLMoE (allenai/OLMoE-1B-7B): Llama attention whose q/k RMSNorms span the whole projection (all heads at once,
not per head: transformers' OlmoeAttention), optional clip_qkv; every layer a sparse MoE block of `num_experts`
experts of width `intermediate_size`, softmax top-k, renormalised only with norm_topk_prob."""

from __future__ import annotations

from typing import Optional

import torch
from transformers import PretrainedConfig

from sglang.srt.distributed import get_tensor_model_parallel_world_size
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.models.llama import LlamaAttention, LlamaModel
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
from sglang.srt.models.sparse_moe import SparseMoeDecoderLayer, SparseMoeShape


class OlmoeAttention(LlamaAttention):
    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__(config, layer_id, dtype, max_position, quantization)
        if get_tensor_model_parallel_world_size() != 1:
            # The norm's mean runs over every head's outputs: one rank's heads are not enough to compute it.
            raise ValueError("OlmoeForCausalLM: its q/k norm spans all heads; --tp-size must be 1")
        self.q_norm = RMSNorm(self.q_size, eps=config.rms_norm_eps, params_dtype=dtype)
        self.k_norm = RMSNorm(self.kv_size, eps=config.rms_norm_eps, params_dtype=dtype)
        self.clip_qkv: Optional[float] = getattr(config, "clip_qkv", None)

    def attend(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(min=-self.clip_qkv, max=self.clip_qkv) for t in (q, k, v))
        q, k = self.rotary_emb(positions, q, k)
        return self.attn(q, k, v.contiguous(), forward_batch)


class OlmoeDecoderLayer(SparseMoeDecoderLayer):
    attention_cls = OlmoeAttention

    @staticmethod
    def moe_shape(config: PretrainedConfig, layer_id: int) -> Optional[SparseMoeShape]:
        return SparseMoeShape(
            hidden_size=config.hidden_size,
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            expert_intermediate_size=config.intermediate_size,
            renormalize=bool(config.norm_topk_prob),
        )


class OlmoeModel(LlamaModel):
    layer_cls = OlmoeDecoderLayer


class OlmoeForCausalLM(Qwen3MoeForCausalLM):
    model_cls = OlmoeModel


EntryClass = OlmoeForCausalLM
