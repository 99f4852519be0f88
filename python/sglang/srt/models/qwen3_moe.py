"""Qwen3-MoE (Qwen3-30B-A3B architecture): Qwen3 attention, routed experts with normalised top-k.

Each sparse layer has a router (`mlp.gate`) and experts (`mlp.experts`, a FusedMoE). With the KT
flags the experts are wrapped by KTEPWrapperMethod (hybrid CPU/GPU experts, see kt_ep_wrapper.py).
"""

from __future__ import annotations

from typing import Optional, Set, Tuple

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.configs.kt_config import KTConfig
from sglang.srt.distributed import tensor_model_parallel_all_reduce
from sglang.srt.layers.linear import CHECKPOINT_FP8_FORMATS, NormInto, ReplicatedLinear
from sglang.srt.layers.moe.kt_ep_wrapper import KTState, build_moe_experts
from sglang.srt.layers.moe.kt_prefill_slot import KTPrefillSlot
from sglang.srt.layers.quantization import layer_experts_method
from sglang.srt.layers.quantization.block_fp8_activation import Activation
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from sglang.srt.models.moe_weights import Weights, finish_kt_layers, load_moe_weights
from sglang.srt.models.qwen3 import Qwen3Attention


def is_sparse_layer(config: PretrainedConfig, layer_id: int) -> bool:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer_id not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_id + 1) % step == 0
    )


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        kt_state: Optional[KTState],
        experts_method: str = "BF16",
    ) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=False, params_dtype=dtype)
        self.experts = build_moe_experts(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            params_dtype=dtype,
            renormalize=bool(getattr(config, "norm_topk_prob", True)),
            layer_id=layer_id,
            kt_state=kt_state,
            quant_method=experts_method,
        )

    def forward(
        self, hidden_states: torch.Tensor, is_prefill: bool = False, num_real_tokens: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        # Each rank holds a slice of every expert's intermediate dimension: partial sums, then all-reduce.
        logits = self.gate(hidden_states)
        return tensor_model_parallel_all_reduce(self.experts(hidden_states, logits, is_prefill, num_real_tokens))


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        quantization: Optional[str],
        kt_state: Optional[KTState] = None,
    ) -> nn.Module:
        # ModelConfig refuses --quantization for MoE models: experts have formats of their own (--kt-method). A
        # native FP8 checkpoint's format (the GPU's) applies to every linear layer; its experts stay fp8 with the
        # checkpoint's scales (FP8 for 128x128 blocks, FP8_PERCHANNEL for per-channel or per-tensor ones).
        if quantization not in (None, *CHECKPOINT_FP8_FORMATS):
            raise ValueError(f"quantization {quantization!r} of a MoE model's linear layers is not supported")
        if is_sparse_layer(config, layer_id):
            experts = layer_experts_method(quantization, config, layer_id)
            return Qwen3MoeSparseMoeBlock(config, layer_id, dtype, kt_state, experts)
        return LlamaMLP(config.hidden_size, config.intermediate_size, dtype, quantization=quantization)

    def mlp_forward_add_norm(
        self, hidden_states: Activation, residual: torch.Tensor, next_norm: NormInto, forward_batch
    ) -> Tuple[Activation, torch.Tensor]:
        if isinstance(self.mlp, Qwen3MoeSparseMoeBlock):
            out = self.mlp(hidden_states, forward_batch.forward_mode.is_extend(), forward_batch.num_real_tokens)
            return next_norm(out, residual)
        return super().mlp_forward_add_norm(hidden_states, residual, next_norm, forward_batch)


class Qwen3MoeModel(LlamaModel):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3MoeModel

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: Optional[int] = None,
        quantization: Optional[str] = None,
        kt: Optional[KTConfig] = None,
    ) -> None:
        kt_state = KTState(kt) if kt is not None else None  # one per model, handed to every MoE layer
        super().__init__(config, dtype, max_position, quantization, kt_state=kt_state)
        self.kt_state = kt_state

    @staticmethod
    def kt_checkpoint_names(weights: Weights) -> Weights:
        """How --kt-weight-path's tensor names map to ours (the same names here; Mixtral renames)."""
        return weights

    def load_weights(self, weights: Weights) -> Set[str]:
        return load_moe_weights(self, weights, self.kt_state, self.stacked_params_mapping, self.kt_checkpoint_names)

    def kt_prefill_slot(self) -> Optional[KTPrefillSlot]:
        return None if self.kt_state is None else self.kt_state.prefill_slot

    def finish_loading(self) -> None:
        finish_kt_layers(self)


EntryClass = Qwen3MoeForCausalLM
