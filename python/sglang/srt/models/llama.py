"""Llama decoder (also SmolLM2), written once and specialised by Qwen2 (qkv bias) and Qwen3 (q/k norm)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Set, Tuple

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.configs.model_config import attention_head_dim, total_num_kv_heads
from sglang.srt.configs.sliding_window import layer_sliding_window
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    NormInto,
    QKVParallelLinear,
    RowParallelLinear,
)
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.quantization.block_fp8_activation import Activation
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import QKNorm, get_rope
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_loading import load_stacked_weights
from sglang.srt.models.utils import create_fused_set_kv_buffer_arg


class LlamaMLP(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        dtype: torch.dtype,
        prefix: str = "",
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, params_dtype=dtype, quantization=quantization
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, params_dtype=dtype, quantization=quantization
        )

    def activation(self, x: Activation) -> Activation:
        """``silu_and_mul(gate_up(x))``, down_proj's input (handed over quantized where down_proj takes it so)."""
        return self.gate_up_proj.silu_and_mul(x, into=self.down_proj)

    def forward_add_norm(
        self, x: Activation, residual: torch.Tensor, norm: NormInto
    ) -> Tuple[Activation, torch.Tensor]:
        """``norm(down(silu_and_mul(gate_up(x))), residual)``, the add and norm in down_proj's split-K sum kernel
        where it can (``RowParallelLinear.forward_add_norm``): the decoder's only use of the MLP."""
        return self.down_proj.forward_add_norm(self.activation(x), residual, norm)


class LlamaAttention(nn.Module):
    qkv_bias = False
    qk_norm = False
    reads_attention_bias = True  # False: the family's projections never carry a bias (Phi-3)

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
        attention_bias = self.reads_attention_bias and getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            total_num_kv_heads(config),
            bias=self.qkv_bias or attention_bias,
            params_dtype=dtype,
            quantization=quantization,
        )
        heads = self.qkv_proj.heads
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=attention_bias and not self.qkv_bias,
            params_dtype=dtype,
            input_range=(heads.q_start * self.head_dim, heads.q_end * self.head_dim),  # this rank's query heads
            quantization=quantization,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps, params_dtype=dtype)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps, params_dtype=dtype)
        self.rotary_emb = get_rope(config, self.head_dim, max_position, dtype)
        self.attn = RadixAttention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            self.num_kv_heads,
            layer_id=layer_id,
            sliding_window_size=layer_sliding_window(config, layer_id),  # Mistral's window, honoured
        )

    def input_projection(self) -> LinearBase:
        """The projection that alone reads the layer's input norm (its output may come quantized for it)."""
        return self.qkv_proj

    def attend(self, positions: torch.Tensor, hidden_states: Activation, forward_batch) -> Activation:
        """Everything up to o_proj: its input (the attention output of every head, quantized for a block-fp8
        o_proj); the decoder runs o_proj with the residual add and norm after it
        (``RowParallelLinear.forward_add_norm``)."""
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # Rotary norms each head of q and k first where the family does (in place on the strided views of qkv) and
        # on the GPU also stores K/V in the pool: one kernel; attention then skips the store.
        qk_norm = QKNorm(self.q_norm.weight, self.k_norm.weight, self.q_norm.variance_epsilon) if self.qk_norm else None
        kv_store = create_fused_set_kv_buffer_arg(k, v, self.attn, forward_batch)
        q, k = self.rotary_emb(positions, q, k, fused_set_kv_buffer_arg=kv_store, qk_norm=qk_norm)
        quantize = self.o_proj.input_quantization(q)  # a block-fp8 o_proj takes the output quantized
        if kv_store is not None:
            return self.attn(q, k, v, forward_batch, save_kv_cache=False, quantize=quantize)
        return self.attn(q, k, v.contiguous(), forward_batch, quantize=quantize)


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
        **mlp_kwargs: Any,
    ) -> None:
        """`quantization`: the linear layers' weight format (None or "fp8"); `mlp_kwargs` go to make_mlp
        (what a subclass's MLP needs, e.g. Qwen3-MoE's KT state)."""
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id, dtype, max_position, quantization)
        self.mlp = self.make_mlp(config, layer_id, dtype, quantization, **mlp_kwargs)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, params_dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, params_dtype=dtype)
        # Each norm with the projection that reads its output: a block-fp8 one takes it quantized by the norm.
        self.input_norm = NormInto(self.input_layernorm, self.self_attn.input_projection())
        mlp_input = self.mlp.gate_up_proj if isinstance(self.mlp, LlamaMLP) else None  # MoE: router and experts
        self.post_attention_norm = NormInto(self.post_attention_layernorm, mlp_input)

    def make_mlp(
        self, config: PretrainedConfig, layer_id: int, dtype: torch.dtype, quantization: Optional[str]
    ) -> nn.Module:
        return LlamaMLP(config.hidden_size, config.intermediate_size, dtype, quantization=quantization)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: Activation,
        residual: Optional[torch.Tensor],
        forward_batch,
        next_norm: NormInto,
    ) -> Tuple[Activation, torch.Tensor]:
        """``hidden_states``: the embeddings (the first layer, ``residual`` None), else this layer's input norm of
        the residual stream ``residual`` (the layer before applied it as its ``next_norm``). Returns
        (next_norm(stream), stream) for the stream after this layer; ``next_norm`` is the next layer's input
        norm or the model's final one. Each residual add and norm runs in the split-K sum kernel of the GEMM
        before it (o_proj, down) where that GEMM splits K at this batch size, else in the norm's own kernel; a
        norm's output goes to a block-fp8 projection after it quantized by that kernel (``NormInto``)."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_norm(hidden_states)
        attention = self.self_attn.attend(positions, hidden_states, forward_batch)
        hidden_states, residual = self.self_attn.o_proj.forward_add_norm(attention, residual, self.post_attention_norm)
        return self.mlp_forward_add_norm(hidden_states, residual, next_norm, forward_batch)

    def mlp_forward_add_norm(
        self, hidden_states: Activation, residual: torch.Tensor, next_norm: NormInto, forward_batch
    ) -> Tuple[Activation, torch.Tensor]:
        """``next_norm(mlp(hidden_states), residual)``."""
        return self.mlp.forward_add_norm(hidden_states, residual, next_norm)


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
        **mlp_kwargs: Any,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, params_dtype=dtype)
        self.layers = nn.ModuleList(
            [
                self.layer_cls(config, i, dtype, max_position, quantization, **mlp_kwargs)
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, params_dtype=dtype)
        self.final_norm = NormInto(self.norm, None)  # the lm_head reads it (bf16)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        next_norms = [layer.input_norm for layer in self.layers[1:]] + [self.final_norm]
        for layer, next_norm in zip(self.layers, next_norms):
            hidden_states, residual = layer(positions, hidden_states, residual, forward_batch, next_norm)
        return hidden_states  # the final norm of the stream (the last layer's next_norm)


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
    # checkpoint suffix -> (our parameter suffix, shard id)
    stacked_params_mapping = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: Optional[int] = None,
        quantization: Optional[str] = None,
        **mlp_kwargs: Any,
    ) -> None:
        """`quantization` ("fp8" or None): the decoder's linear layers' weights (embeddings, norms and
        lm_head stay in `dtype`)."""
        super().__init__()
        self.config = config
        max_position = max_position or getattr(config, "max_position_embeddings", 4096)
        self.model = self.model_cls(config, dtype, max_position, quantization, **mlp_kwargs)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, params_dtype=dtype)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        """The name a checkpoint tensor is loaded under (Mixtral renames its experts'); the FP8 loader asks it
        which parameter a checkpoint weight lands in before load_weights sees the tensor."""
        return name

    def kt_prefill_slot(self):
        """The model's KT prefill slot (MoE models with --kt-gpu-prefill-token-threshold); None: no slot."""
        return None

    def finish_loading(self) -> None:
        """Work after every weight is in place (MoE models quantize/pin experts here)."""

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        skip = ("rotary_emb.inv_freq",)
        if getattr(self.config, "tie_word_embeddings", False):
            skip += ("lm_head.weight",)
        return load_stacked_weights(self, weights, self.stacked_params_mapping, skip)


EntryClass = LlamaForCausalLM
