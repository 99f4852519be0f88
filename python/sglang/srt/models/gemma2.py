"""Gemma 2 (and, specialised in gemma3.py, Gemma 3 text), computing what transformers' modeling_gemma2.py does:
embeddings scaled by sqrt(hidden_size) in the model dtype, Gemma's (1 + w) RMSNorm around both the attention and the
MLP (four norms a layer), a GeGLU MLP, attention scaled by query_pre_attn_scalar^-0.5 with its logits soft-capped
in the attention kernels (`attn_logit_softcapping`) and a sliding window on the layers `layer_types` names, and
the final logits soft-capped (`final_logit_softcapping`) before sampling and logprobs. configs/gemma.py refuses at
start-up what this file does not run."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.configs.model_config import attention_head_dim, total_num_kv_heads
from sglang.srt.configs.sliding_window import layer_sliding_window
from sglang.srt.layers.activation import gelu_tanh_and_mul
from sglang.srt.layers.layernorm import GemmaRMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.utils import create_fused_set_kv_buffer_arg


class GemmaMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up in one GEMM."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, quantization: Optional[str] = None
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, params_dtype=dtype, quantization=quantization
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, params_dtype=dtype, quantization=quantization
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x)))


class Gemma2Attention(nn.Module):
    qk_norm = False  # Gemma 3 norms each head of q and k before the rotary embedding

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.head_dim = attention_head_dim(config)
        bias = bool(getattr(config, "attention_bias", False))  # q, k, v and o alike, as transformers
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            total_num_kv_heads(config),
            bias=bias,
            params_dtype=dtype,
            quantization=quantization,
        )
        heads = self.qkv_proj.heads
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=bias,
            params_dtype=dtype,
            input_range=(heads.q_start * self.head_dim, heads.q_end * self.head_dim),  # this rank's query heads
            quantization=quantization,
        )
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps, params_dtype=dtype)
            self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps, params_dtype=dtype)
        self.rotary_emb = self.make_rope(config, layer_id, self.head_dim, max_position, dtype)
        self.attn = RadixAttention(
            self.qkv_proj.num_heads,
            self.head_dim,
            config.query_pre_attn_scalar**-0.5,
            self.qkv_proj.num_kv_heads,
            layer_id=layer_id,
            logit_cap=self.attention_logit_cap(config),
            sliding_window_size=layer_sliding_window(config, layer_id),
        )

    @staticmethod
    def make_rope(
        config: PretrainedConfig, layer_id: int, head_dim: int, max_position: int, dtype: torch.dtype
    ) -> RotaryEmbedding:
        """Gemma 2: one rope for every layer."""
        return get_rope(config, head_dim, max_position, dtype)

    @staticmethod
    def attention_logit_cap(config: PretrainedConfig) -> float:
        """Gemma 2 soft-caps the attention logits (0: no cap, RadixAttention's convention)."""
        return float(getattr(config, "attn_logit_softcapping", None) or 0.0)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:  # per head; new tensors, which rotary then rotates in place on the GPU
            n = q.shape[0]
            q = self.q_norm(q.view(n, -1, self.head_dim)).view(n, -1)
            k = self.k_norm(k.view(n, -1, self.head_dim)).view(n, -1)
        # On the GPU rotary also stores K/V in the pool (one kernel): attention then skips the store.
        kv_store = create_fused_set_kv_buffer_arg(k, v, self.attn, forward_batch)
        q, k = self.rotary_emb(positions, q, k, fused_set_kv_buffer_arg=kv_store)
        if kv_store is not None:
            out = self.attn(q, k, v, forward_batch, save_kv_cache=False)
        else:
            out = self.attn(q, k, v.contiguous(), forward_batch)
        return self.o_proj(out)


class Gemma2DecoderLayer(nn.Module):
    attention_cls = Gemma2Attention

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id, dtype, max_position, quantization)
        self.mlp = GemmaMLP(config.hidden_size, config.intermediate_size, dtype, quantization)

        def norm() -> GemmaRMSNorm:
            return GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps, params_dtype=dtype)

        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        """The residual stream after this layer: each block's output is normed before it joins the stream."""
        attention = self.self_attn(positions, self.input_layernorm(hidden_states), forward_batch)
        hidden_states = hidden_states + self.post_attention_layernorm(attention)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        return hidden_states + self.post_feedforward_layernorm(mlp)


class Gemma2Model(nn.Module):
    layer_cls = Gemma2DecoderLayer

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, params_dtype=dtype)
        # sqrt(hidden_size) rounded to the model dtype, as transformers multiplies (55.4256 is 55.5 in bf16).
        self.register_buffer("embed_scale", torch.tensor(config.hidden_size**0.5, dtype=dtype), persistent=False)
        self.layers = nn.ModuleList(
            [self.layer_cls(config, i, dtype, max_position, quantization) for i in range(config.num_hidden_layers)]
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps, params_dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) * self.embed_scale
        for layer in self.layers:
            hidden_states = layer(positions, hidden_states, forward_batch)
        return self.norm(hidden_states)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Llama's head, weight loading (q/k/v and gate/up stacked) and tied embeddings; the final logits soft-capped."""

    model_cls = Gemma2Model

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: Optional[int] = None,
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__(config, dtype, max_position, quantization)
        self.logits_processor = LogitsProcessor(
            config.vocab_size, final_logit_softcapping=getattr(config, "final_logit_softcapping", None)
        )


EntryClass = Gemma2ForCausalLM
