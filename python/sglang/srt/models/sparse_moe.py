"""The routed-experts block the softmax-routed MoE families share (Mixtral, Qwen2-MoE, OLMoE): a router
(`gate`, no bias) and the experts (FusedMoE, or with the KT flags the hybrid KTEPWrapperMethod), with an
optional shared expert scaled by sigmoid(shared_expert_gate(x)) (Qwen2-MoE).

Routing is softmax over all experts, top-k, renormalised to sum to one when `renormalize` (Mixtral always,
Qwen2-MoE / OLMoE with norm_topk_prob): layers/moe/topk.py:select_experts, the one routing path of the GPU
experts, the CPU kernels and the KT prefill slot.

A native FP8 checkpoint on the GPU (configs/quantization_config.py: Mixtral, Qwen2-MoE, OLMoE) keeps its fp8 in the
attention, shared expert and dense MLPs (the linear format) and, block-fp8, in the routed experts (the fused MoE's
FP8 layout, or with --kt-method FP8 the CPU kernels'; Mixtral's w1/w2/w3 found through its checkpoint_name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.distributed import tensor_model_parallel_all_reduce
from sglang.srt.layers.linear import CHECKPOINT_FP8_FORMATS, NormInto, ReplicatedLinear
from sglang.srt.layers.moe.kt_ep_wrapper import KTState, build_moe_experts
from sglang.srt.layers.quantization import layer_experts_method
from sglang.srt.layers.quantization.block_fp8_activation import Activation
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaMLP


@dataclass(frozen=True)
class SparseMoeShape:
    hidden_size: int
    num_experts: int
    top_k: int
    expert_intermediate_size: int  # one routed expert's width
    renormalize: bool
    shared_expert_intermediate_size: int = 0  # 0: no shared expert


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        shape: SparseMoeShape,
        layer_id: int,
        dtype: torch.dtype,
        kt_state: Optional[KTState],
        quantization: Optional[str] = None,
        experts_method: str = "BF16",
    ) -> None:
        """`quantization`: a native FP8 checkpoint's linear format on the GPU (the shared expert's);
        `experts_method`: the routed experts' format without KT (quantization.layer_experts_method: block fp8
        keeps them fp8 with the checkpoint's scales, a pack-quantized checkpoint INT4 in its groups).
        The routers stay in full precision."""
        super().__init__()
        self.gate = ReplicatedLinear(shape.hidden_size, shape.num_experts, bias=False, params_dtype=dtype)
        self.experts = build_moe_experts(
            num_experts=shape.num_experts,
            top_k=shape.top_k,
            hidden_size=shape.hidden_size,
            intermediate_size=shape.expert_intermediate_size,
            params_dtype=dtype,
            renormalize=shape.renormalize,
            layer_id=layer_id,
            kt_state=kt_state,
            quant_method=experts_method,
        )
        self.shared_expert: Optional[LlamaMLP] = None
        if shape.shared_expert_intermediate_size:
            width = shape.shared_expert_intermediate_size
            self.shared_expert = LlamaMLP(shape.hidden_size, width, dtype, quantization=quantization)
            self.shared_expert_gate = ReplicatedLinear(shape.hidden_size, 1, bias=False, params_dtype=dtype)

    def forward(
        self, hidden_states: torch.Tensor, is_prefill: bool = False, num_real_tokens: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """`is_prefill`, `num_real_tokens`: what the KT wrapper reads (the full-GPU prefill path, graph padding)."""
        logits = self.gate(hidden_states)
        # Each rank holds a slice of every expert's intermediate dimension: partial sums, then all-reduce.
        out = tensor_model_parallel_all_reduce(self.experts(hidden_states, logits, is_prefill, num_real_tokens))
        if self.shared_expert is not None:
            shared = self.shared_expert.down_proj(self.shared_expert.activation(hidden_states))
            out = out + torch.sigmoid(self.shared_expert_gate(hidden_states)) * shared
        return out


class SparseMoeDecoderLayer(LlamaDecoderLayer):
    """A Llama-shaped decoder layer whose MLP is a SparseMoeBlock where `moe_shape` gives one (else dense)."""

    @staticmethod
    def moe_shape(config: PretrainedConfig, layer_id: int) -> Optional[SparseMoeShape]:
        raise NotImplementedError

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        quantization: Optional[str],
        kt_state: Optional[KTState] = None,
    ) -> nn.Module:
        # Only a native FP8 checkpoint's own format (ModelConfig refuses online --quantization for MoE models).
        if quantization not in (None, *CHECKPOINT_FP8_FORMATS):
            raise ValueError(f"quantization {quantization!r} is not supported for {config.architectures[0]}")
        shape = self.moe_shape(config, layer_id)
        if shape is not None:
            experts = layer_experts_method(quantization, config, layer_id)
            return SparseMoeBlock(shape, layer_id, dtype, kt_state, quantization, experts)
        return LlamaMLP(config.hidden_size, config.intermediate_size, dtype, quantization=quantization)

    def mlp_forward_add_norm(
        self, hidden_states: Activation, residual: torch.Tensor, next_norm: NormInto, forward_batch
    ) -> Tuple[Activation, torch.Tensor]:
        if isinstance(self.mlp, SparseMoeBlock):
            fb = forward_batch
            return next_norm(self.mlp(hidden_states, fb.forward_mode.is_extend(), fb.num_real_tokens), residual)
        return super().mlp_forward_add_norm(hidden_states, residual, next_norm, forward_batch)
