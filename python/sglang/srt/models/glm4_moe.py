"""GLM-4.5 / 4.5-Air / 4.6 / 4.7 (Glm4MoeForCausalLM), as transformers' modeling_glm4_moe.py computes it.

Attention: GQA with q/k/v biases when attention_bias (o_proj never has one), per-head q/k RMSNorm when use_qk_norm
(before rotary), rotate-half rotary over each head's first head_dim x partial_rotary_factor values (0.5 in every
release; the rest pass through), softmax scale head_dim^-0.5.

MLP: the first first_k_dense_replace layers are dense SwiGLU (intermediate_size); the others are DeepSeek-V3's MoE
(models/deepseek_v2.py: DeepseekV2MoE, reused): an fp32 router with e_score_correction_bias, sigmoid scores, grouped
top-k (n_group, topk_group), norm_topk_prob, routed_scaling_factor; routed experts of moe_intermediate_size
(FusedMoE, or with the KT flags the hybrid KTEPWrapperMethod); n_shared_experts shared experts as one dense MLP,
always on the model's device. The checkpoint names are DeepSeek-V3's. The multi-token-prediction layers the
checkpoints append (layer num_hidden_layers on, num_nextn_predict_layers of them) are skipped at load.

A native block-FP8 checkpoint (GLM-4.5/4.6/4.7-FP8: `weight_scale_inv` per 128x128 block) on the GPU keeps its fp8
weights and scales in q|k|v (biases in the model's dtype), o_proj, the dense and shared MLPs (the "fp8_block" linear
format) and the routed experts (the FP8 fused-MoE layout, or with --kt-method FP8 the CPU kernels' and the GPU
experts' own copies of the checkpoint's codes). A leading dense MLP whose width is not a multiple of 128
(GLM-4.5-Air's 10944) holds the dequantized weights instead. A per-channel checkpoint (compressed-tensors, one
`weight_scale` per output row) keeps its fp8 the same way in the "fp8_channel" linear format and the FP8_PERCHANNEL
experts (--kt-method FP8_PERCHANNEL under KT). On the CPU every weight is dequantized at load, KT's CPU experts aside.

What we do not run is refused at start-up by name (configs/glm4_moe.py).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.configs.glm4_moe import check_glm4_moe_config
from sglang.srt.configs.kt_config import KTConfig
from sglang.srt.configs.quantization_config import block_aligned_format
from sglang.srt.layers.moe.kt_ep_wrapper import KTState
from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer, DeepseekV2ForCausalLM, DeepseekV2MoE, noaux_tc_routing
from sglang.srt.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel


class Glm4MoeAttention(LlamaAttention):
    def __init__(
        self, config: PretrainedConfig, layer_id: int, dtype: torch.dtype, max_position: int, quantization=None
    ) -> None:
        # attention_bias puts biases on q/k/v only (LlamaAttention then leaves o_proj without one).
        self.qkv_bias = bool(getattr(config, "attention_bias", False))
        self.qk_norm = bool(getattr(config, "use_qk_norm", False))
        # partial_rotary_factor (0.5): the rope reads it from the config (layers/rotary_embedding.py:rotary_dim).
        super().__init__(config, layer_id, dtype, max_position, quantization)


class Glm4MoeDecoderLayer(DeepseekV2DecoderLayer):
    attention_cls = Glm4MoeAttention

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        quantization: Optional[str],
        kt_state: Optional[KTState] = None,
        shared_stream: Optional[torch.cuda.Stream] = None,
    ) -> nn.Module:
        # A block-fp8 checkpoint on the GPU ("fp8_block"): the shared experts keep it as linear layers, the routed
        # experts in the fused MoE's FP8 layout (with the KT flags --kt-method decides); a leading dense MLP too
        # where its width is block-aligned, else it holds the dequantized weights (block_aligned_format).
        if layer_id >= config.first_k_dense_replace and config.n_routed_experts:
            routing = noaux_tc_routing(config)
            return DeepseekV2MoE(
                config,
                layer_id,
                dtype,
                kt_state,
                routing=routing,
                quantization=quantization,
                shared_stream=shared_stream,
            )
        dense_format = block_aligned_format(quantization, config.intermediate_size)
        return LlamaMLP(config.hidden_size, config.intermediate_size, dtype, quantization=dense_format)


class Glm4MoeModel(LlamaModel):
    layer_cls = Glm4MoeDecoderLayer


class Glm4MoeForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V2/V3's model class (KT hybrid experts, MTP layers skipped, MoE weight loading) over GLM's layers."""

    model_cls = Glm4MoeModel
    stacked_params_mapping = LlamaForCausalLM.stacked_params_mapping  # q/k/v fused, gate/up fused

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: Optional[int] = None,
        quantization: Optional[str] = None,
        kt: Optional[KTConfig] = None,
    ) -> None:
        check_glm4_moe_config(config)  # the refusals ModelConfig applies, for a model built directly
        super().__init__(config, dtype, max_position, quantization, kt)


EntryClass = Glm4MoeForCausalLM
