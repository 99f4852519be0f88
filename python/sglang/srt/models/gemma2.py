"""Gemma 2 (and, specialised in gemma3.py, Gemma 3 text), computing what transformers' modeling_gemma2.py does:
embeddings scaled by sqrt(hidden_size) in the model dtype, Gemma's (1 + w) RMSNorm around both the attention and the
MLP (four norms a layer), a GeGLU MLP, attention scaled by query_pre_attn_scalar^-0.5 with its logits soft-capped
in the attention kernels (`attn_logit_softcapping`) and a sliding window on the layers `layer_types` names, and
the final logits soft-capped (`final_logit_softcapping`) before sampling and logprobs. configs/gemma.py refuses at
start-up what this file does not run."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.configs.model_config import attention_head_dim, total_num_kv_heads
from sglang.srt.configs.sliding_window import layer_sliding_window
from sglang.srt.layers.activation import gelu_tanh_and_mul
from sglang.srt.layers.layernorm import GemmaRMSNorm, sandwich_norms
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import QKNorm, RotaryEmbedding, get_rope
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
        # Rotary norms each head of q and k first where the family does (Gemma 3, in place on the views of qkv) and on
        # the GPU also stores K/V in the pool: one kernel; attention then skips the store.
        qk_norm = (
            QKNorm(self.q_norm.weight, self.k_norm.weight, self.q_norm.variance_epsilon, unit_offset=True)
            if self.qk_norm
            else None
        )
        kv_store = create_fused_set_kv_buffer_arg(k, v, self.attn, forward_batch)
        q, k = self.rotary_emb(positions, q, k, fused_set_kv_buffer_arg=kv_store, qk_norm=qk_norm)
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

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor,
        forward_batch,
        next_norm: GemmaRMSNorm,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``hidden_states``: this layer's input norm of the residual stream ``residual`` (the layer before applied
        it as its ``next_norm``). Each block's output is post-normed before it joins the stream; returns
        (next_norm(stream), stream) after this layer, ``next_norm`` the next layer's input norm or the model's final
        one. Each post-norm, its add and the norm after it are one kernel on the GPU (``sandwich_norms``)."""
        attention = self.self_attn(positions, hidden_states, forward_batch)
        mlp_input, residual = sandwich_norms(
            attention, residual, self.post_attention_layernorm, self.pre_feedforward_layernorm
        )
        return sandwich_norms(self.mlp(mlp_input), residual, self.post_feedforward_layernorm, next_norm)


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
        residual = self.embed_tokens(input_ids) * self.embed_scale  # the residual stream (a temporary of this loop)
        hidden_states = self.layers[0].input_layernorm(residual)
        next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm in zip(self.layers, next_norms):
            hidden_states, residual = layer(positions, hidden_states, residual, forward_batch, next_norm)
        return hidden_states  # the final norm of the stream (the last layer's next_norm)


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
