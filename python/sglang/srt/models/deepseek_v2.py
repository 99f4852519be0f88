"""DeepSeek-V2 / V2-Lite and DeepSeek-V3 / R1 / Kimi-K2: multi-head latent attention (MLA) and DeepSeekMoE.

Attention (transformers' DeepseekV2Attention / DeepseekV3Attention compute the same):
    q = q_b_proj(q_a_layernorm(q_a_proj(x)))  (q_lora_rank set)  or  q_proj(x)        -> heads x (nope + rope)
    [c_kv | k_rope] = kv_a_proj_with_mqa(x); c_kv = kv_a_layernorm(c_kv)                 -> the cached latent row
    (q_proj or q_a_proj and kv_a_proj_with_mqa are one GEMM here: fused_qkv_a_proj_with_mqa)
    rotary on the rope parts (interleaved pairs: V2 always, V3 when rope_interleave), softmax scale
    (nope + rope)^-0.5 times YaRN's mscale^2, keys/values of every head from kv_b_proj(c_kv), o_proj.
The latent row is what the pool keeps (MLATokenToKVPool); layers/attention/mla_torch.py attends over it.

MoE (layers from first_k_dense_replace on): a router (`mlp.gate`, fp32, V3 with e_score_correction_bias),
routed experts (FusedMoE, or with the KT flags KTEPWrapperMethod: some on the model's device, the rest in the
CPU kernels) chosen by layers/moe/topk.select_experts_grouped, plus shared experts (one dense MLP of
moe_intermediate_size x n_shared_experts, always on the model's device) for every token. The V3 multi-token-prediction layer that
checkpoints append (layer num_hidden_layers) is not part of the forward: skipped at load.

Tensor parallelism splits the heads (uneven splits too) and every expert's intermediate dimension; the
latent projections and the router are replicated.

A native block-FP8 checkpoint (DeepSeek-V3/R1, Kimi-K2: `weight_scale_inv` per 128x128 block) on the GPU keeps
its fp8 weights and scales in every projection the model multiplies activations by (q, kv_a, o_proj, the dense
and shared MLPs: the "fp8_block" linear format) and in the routed experts (the FP8 fused-MoE layout, or the KT
CPU kernels' with --kt-method FP8). kv_b_proj alone arrives dequantized (the loader's choice, through
checkpoint_parameter_filter): attention never multiplies an activation by it as a linear layer, it splits it into
W_UK / W_UV and absorbs them into the query and the latent context (layers/attention/mla_torch.py).
On the CPU every weight is dequantized at load.
"""

from __future__ import annotations

import logging
import math
from typing import Iterable, Iterator, Optional, Set, Tuple

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.configs.deepseek import DEEPSEEK_V3_ARCH, check_deepseek_config, mtp_layer_count
from sglang.srt.configs.kt_config import KTConfig
from sglang.srt.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from sglang.srt.distributed.partition import shard_range
from sglang.srt.layers import kernel_dispatch
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    CHECKPOINT_FP8_FORMATS,
    ColumnParallelLinear,
    LinearBase,
    NormInto,
    RowParallelLinear,
    StackedLinear,
)
from sglang.srt.layers.mla_attention import MLAAttention
from sglang.srt.layers.moe.kt_ep_wrapper import KTState, build_moe_experts
from sglang.srt.layers.moe.kt_prefill_slot import KTPrefillSlot
from sglang.srt.layers.moe.layer import moe_intermediate_partition
from sglang.srt.layers.moe.router_gemm import router_logits
from sglang.srt.layers.moe.topk import GroupedTopKConfig, SharedExpertSlots, select_experts_grouped
from sglang.srt.layers.moe.weight_format import SharedMLPWeights
from sglang.srt.layers.quantization import layer_experts_method
from sglang.srt.layers.quantization.block_fp8_activation import Activation
from sglang.srt.layers.rotary_embedding import _rope_parameters, get_rope
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from sglang.srt.models.moe_weights import finish_kt_layers, load_moe_weights
from sglang.srt.models.utils import create_fused_latent_store_arg

logger = logging.getLogger(__name__)

# transformers' DeepSeek RMSNorms of the latents (q_a_layernorm, kv_a_layernorm) use their default epsilon,
# not the config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def yarn_softmax_scale(config: PretrainedConfig, qk_head_dim: int) -> float:
    """(nope + rope)^-0.5, times mscale^2 under a scaled rope with mscale_all_dim (DeepSeek-V3's YaRN):
    mscale = 0.1 * mscale_all_dim * ln(factor) + 1 for factor > 1."""
    scale = qk_head_dim**-0.5
    params = _rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim") or 0
    factor = params.get("factor") or 1.0
    if params.get("rope_type", "default") != "default" and mscale_all_dim and factor > 1:
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def rope_is_interleaved(config: PretrainedConfig) -> bool:
    """V2 always rotates interleaved pairs (complex form); V3 does unless rope_interleave is false."""
    if (config.architectures or [""])[0] != DEEPSEEK_V3_ARCH:
        return True
    return bool(getattr(config, "rope_interleave", True))


class HeadParallelLinear(ColumnParallelLinear):
    """Column-parallel by whole heads of `head_size` outputs: this rank holds heads shard_range(num_heads)."""

    def __init__(
        self,
        input_size: int,
        num_heads: int,
        head_size: int,
        params_dtype: torch.dtype,
        quantization: Optional[str] = None,
    ) -> None:
        self.total_heads, self.head_size = num_heads, head_size
        super().__init__(
            input_size, num_heads * head_size, bias=False, params_dtype=params_dtype, quantization=quantization
        )

    def _output_range(self, output_size: int) -> tuple[int, int]:
        start, end = shard_range(self.total_heads, self.tp_size, self.tp_rank)
        return start * self.head_size, end * self.head_size


class DeepseekV2Attention(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        max_position: int,
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = config.v_head_dim, config.kv_lora_rank
        qk = self.nope + self.rope
        start, end = shard_range(
            config.num_attention_heads, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        )
        self.num_heads = end - start
        self.q_lora_rank = config.q_lora_rank
        quant = quantization  # the checkpoint's fp8 format on the GPU (see the module docstring), else None
        # The query projection (q_proj: this rank's heads; or q_a_proj: replicated) and kv_a_proj_with_mqa both read
        # the layer's input: one GEMM serves both (SGLang's fused_qkv_a_proj_with_mqa), one launch less a layer.
        kv_a_rows = self.kv_lora_rank + self.rope
        if self.q_lora_rank is None:
            q_part = (config.num_attention_heads * qk, start * qk, self.num_heads * qk)
        else:
            q_part = (self.q_lora_rank, 0, self.q_lora_rank)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=LATENT_NORM_EPS, params_dtype=dtype)
            self.q_b_proj = HeadParallelLinear(self.q_lora_rank, config.num_attention_heads, qk, dtype, quant)
        self.fused_qkv_a_proj_with_mqa = StackedLinear(
            hidden, {"q": q_part, "kv_a": (kv_a_rows, 0, kv_a_rows)}, params_dtype=dtype, quantization=quant
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=LATENT_NORM_EPS, params_dtype=dtype)
        # Always in the model's dtype: its weight is W_UK / W_UV, absorbed by the attention (never run as a layer).
        self.kv_b_proj = HeadParallelLinear(
            self.kv_lora_rank, config.num_attention_heads, self.nope + self.v_head_dim, dtype
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.v_head_dim,
            hidden,
            params_dtype=dtype,
            input_range=(start * self.v_head_dim, end * self.v_head_dim),  # this rank's heads' values
            quantization=quant,
        )
        self.rotary_emb = get_rope(config, self.rope, max_position, dtype, interleaved=rope_is_interleaved(config))
        self.attn = MLAAttention(
            self.num_heads,
            self.nope,
            self.rope,
            self.v_head_dim,
            self.kv_lora_rank,
            yarn_softmax_scale(config, qk),
            layer_id,
        )

    def input_projection(self) -> LinearBase:
        """The projection that alone reads the layer's input norm (its output may come quantized for it)."""
        return self.fused_qkv_a_proj_with_mqa

    def attend(self, positions: torch.Tensor, hidden_states: Activation, forward_batch) -> torch.Tensor:
        """Everything up to o_proj: its input [T, heads * v] (the decoder runs o_proj with the residual add)."""
        q, kv_a = self.fused_qkv_a_proj_with_mqa(hidden_states)
        n = q.shape[0]
        latent, k_rope = kv_a.split([self.kv_lora_rank, self.rope], dim=-1)
        if self.q_lora_rank is not None:  # q_a's norm handed to a block-fp8 q_b quantized, by the norm's kernel
            q = self.q_b_proj(self.q_a_layernorm(q, quantize=self.q_b_proj.input_quantization(q)))
        q = q.view(n, self.num_heads, self.nope + self.rope)  # q_proj's columns: a strided view of the fused rows
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        # Both are strided views of the fused rows. Rotary rotates q's and kv_a's rope columns in place on the GPU, one
        # kernel, no copies ([n, H, rope] / [n, rope] views), and there also norms the latent in place and stores it
        # with the rotated key in the pool (attention then skips the store); else the norm runs on its own.
        store = create_fused_latent_store_arg(latent, k_rope, self.attn.layer_id, forward_batch, self.kv_a_layernorm)
        if store is None:
            latent = self.kv_a_layernorm(latent)
        w_kv_b = self.kv_b_proj.weight
        # Where the backend takes it, rotary's kernel also runs q_nope through W_UK (attention one launch fewer).
        absorb = self.attn.query_absorb(q_nope, w_kv_b, forward_batch)
        q_rope, k_rope = self.rotary_emb(positions, q_rope, k_rope, fused_set_kv_buffer_arg=store, query_absorb=absorb)
        q_latent = None if absorb is None else absorb.out
        return self.attn(
            q_nope, q_rope, latent, k_rope, w_kv_b, forward_batch, save_kv_cache=store is None, q_latent=q_latent
        )


class MoEGate(nn.Module):
    """The router: fp32 logits from an fp32 weight (as the reference keeps it), V3's correction bias beside it."""

    def __init__(self, hidden_size: int, num_experts: int, with_correction_bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=torch.float32), requires_grad=False)
        if with_correction_bias:
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(num_experts, dtype=torch.float32), requires_grad=False
            )
        else:
            self.register_parameter("e_score_correction_bias", None)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return router_logits(hidden_states, self.weight)  # one kernel on the GPU, no fp32 copy of the input


def noaux_tc_routing(config: PretrainedConfig) -> GroupedTopKConfig:
    """DeepSeek-V3's routing (also GLM-4.5's): sigmoid scores, grouped choice with the correction bias."""
    return GroupedTopKConfig(
        config.num_experts_per_tok,
        "noaux_tc",
        n_group=config.n_group,
        topk_group=config.topk_group,
        renormalize=bool(config.norm_topk_prob),
        routed_scaling_factor=float(config.routed_scaling_factor),
    )


def routing_config(config: PretrainedConfig) -> GroupedTopKConfig:
    """The routing a (checked) DeepSeek config asks for: V3 noaux_tc, V2 its topk_method."""
    if (config.architectures or [""])[0] == DEEPSEEK_V3_ARCH:
        return noaux_tc_routing(config)
    method = getattr(config, "topk_method", None) or "greedy"
    grouped = method == "group_limited_greedy"
    return GroupedTopKConfig(
        config.num_experts_per_tok,
        method,
        n_group=config.n_group if grouped else 1,
        topk_group=config.topk_group if grouped else 1,
        renormalize=False,
        routed_scaling_factor=float(config.routed_scaling_factor),
    )


def one_token_shared_slots(
    config: PretrainedConfig, experts_method: str, linear_format: Optional[str], kt_state: Optional[KTState]
) -> Optional[SharedExpertSlots]:
    """Where one token's shared experts run as slots of the routed experts' GEMMs (the fused MoE reading the shared
    MLP's own weights, no second copy): without KT, full-precision experts and shared MLP, and each rank's share of
    the shared MLP exactly `n_shared_experts` of its share of an expert (tensor parallelism splits both alike). One
    token's chain of kernels a layer is then the routing, the two expert GEMMs, the sum and the add-norm, where the
    shared MLP's GEMMs ran beside it and its down_proj's sum added the routed output; more tokens keep the dense
    shared MLP (as extra slots its weights would be read again for every 16-token tile)."""
    shared = config.n_shared_experts or 0
    if not shared or kt_state is not None or experts_method != "BF16" or linear_format is not None:
        return None
    expert_width = moe_intermediate_partition(config.moe_intermediate_size)
    shared_width = shard_range(
        config.moe_intermediate_size * shared,
        get_tensor_model_parallel_world_size(),
        get_tensor_model_parallel_rank(),
    )
    if (shared_width[1] - shared_width[0]) != shared * (expert_width[1] - expert_width[0]):
        return None
    return SharedExpertSlots(first=config.n_routed_experts, count=shared)


class DeepseekV2MoE(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        kt_state: Optional[KTState] = None,
        routing: Optional[GroupedTopKConfig] = None,
        quantization: Optional[str] = None,
        shared_stream: Optional[torch.cuda.Stream] = None,
    ) -> None:
        """`kt_state`: the model's KT hybrid state (routed experts split between the model's device and the CPU
        kernels, kt_ep_wrapper.py); the shared experts always stay on the model's device. `routing`: another
        family's routing (GLM-4.5), else the DeepSeek config's own (routing_config). `quantization`: the
        checkpoint's fp8 linear format (shared experts), block fp8 also keeping the routed experts in FP8.
        `shared_stream`: the model's second CUDA stream, where a captured decode step runs the shared experts'
        gate_up beside the routing (None: one stream)."""
        super().__init__()
        self.shared_stream = shared_stream
        self.routing = routing or routing_config(config)
        self.gate = MoEGate(config.hidden_size, config.n_routed_experts, self.routing.topk_method == "noaux_tc")
        experts_method = layer_experts_method(quantization, config, layer_id)
        self.experts = build_moe_experts(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            params_dtype=dtype,
            renormalize=False,  # the routing is computed here (topk_output)
            layer_id=layer_id,
            kt_state=kt_state,
            quant_method=experts_method,
        )
        # One token's shared experts as slots of the experts' GEMMs (one_token_shared_slots), else None.
        self.shared_slots = one_token_shared_slots(config, experts_method, quantization, kt_state)
        shared = config.n_shared_experts or 0
        self.shared_experts = (
            LlamaMLP(config.hidden_size, config.moe_intermediate_size * shared, dtype, quantization=quantization)
            if shared
            else None
        )

    def routed(
        self,
        hidden_states: torch.Tensor,
        is_prefill: bool = False,
        num_real_tokens: Optional[torch.Tensor] = None,
        with_shared: bool = False,
    ) -> torch.Tensor:
        """The routed experts' output, with the shared experts' as slots of the same kernels where `with_shared`
        (one token: one_token_shared_slots). `is_prefill`, `num_real_tokens`: what the KT wrapper reads (the
        full-GPU prefill path, graph padding)."""
        logits = self.gate(hidden_states)
        slots = self.shared_slots if with_shared else None
        topk = select_experts_grouped(logits, self.routing, self.gate.e_score_correction_bias, slots)
        shared = None
        if with_shared:
            mlp = self.shared_experts
            shared = SharedMLPWeights(mlp.gate_up_proj.weight, mlp.down_proj.weight, self.shared_slots.count)
        # Each rank holds a slice of every expert's intermediate dimension: partial sums, then all-reduce.
        experts = self.experts(hidden_states, logits, is_prefill, num_real_tokens, topk_output=topk, shared=shared)
        return tensor_model_parallel_all_reduce(experts)

    def forward_add_norm(
        self,
        hidden_states: torch.Tensor,
        residual: torch.Tensor,
        next_norm: NormInto,
        is_prefill: bool = False,
        num_real_tokens: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``next_norm(routed + shared experts' output, residual)``, the decoder's only use of the MoE block: the
        shared experts' down_proj adds the routed output, the residual and the norm where its split-K sum kernel
        can (RowParallelLinear.forward_add_norm), with the same bits."""
        shared = self.shared_experts
        if shared is None:
            return next_norm(self.routed(hidden_states, is_prefill, num_real_tokens), residual)
        one_token = hidden_states.shape[0] == 1
        if self.shared_slots is not None and one_token and kernel_dispatch.runs_moe_kernel(hidden_states):
            out = self.routed(hidden_states, is_prefill, num_real_tokens, with_shared=True)
            return next_norm(out, residual)
        if self.shared_stream is None or is_prefill or not torch.cuda.is_current_stream_capturing():
            out = self.routed(hidden_states, is_prefill, num_real_tokens)
            act = shared.activation(hidden_states)
        else:
            # A decode graph: the routing chain (router, top-k, align: kernels of one or a few programs) leaves most
            # SMs idle, so the shared experts' gate_up streams its weights beside it, a branch of the graph on the
            # second stream (eager steps stay on one stream: the fork and join would cost host time there).
            main = torch.cuda.current_stream()
            self.shared_stream.wait_stream(main)
            with torch.cuda.stream(self.shared_stream):
                act = shared.activation(hidden_states)
            out = self.routed(hidden_states, is_prefill, num_real_tokens)
            main.wait_stream(self.shared_stream)
        return shared.down_proj.forward_add_norm(act, residual, next_norm, addend=out)


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    attention_cls = DeepseekV2Attention

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_id: int,
        dtype: torch.dtype,
        quantization: Optional[str],
        kt_state: Optional[KTState] = None,
        shared_stream: Optional[torch.cuda.Stream] = None,
    ) -> nn.Module:
        if layer_id >= (config.first_k_dense_replace or 0) and config.n_routed_experts:
            return DeepseekV2MoE(
                config, layer_id, dtype, kt_state, quantization=quantization, shared_stream=shared_stream
            )
        return LlamaMLP(config.hidden_size, config.intermediate_size, dtype, quantization=quantization)

    def mlp_forward_add_norm(
        self, hidden_states: Activation, residual: torch.Tensor, next_norm: NormInto, forward_batch
    ) -> Tuple[Activation, torch.Tensor]:
        if isinstance(self.mlp, DeepseekV2MoE):
            fb = forward_batch
            return self.mlp.forward_add_norm(
                hidden_states, residual, next_norm, fb.forward_mode.is_extend(), fb.num_real_tokens
            )
        return super().mlp_forward_add_norm(hidden_states, residual, next_norm, forward_batch)


class DeepseekV2Model(LlamaModel):
    layer_cls = DeepseekV2DecoderLayer


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    model_cls = DeepseekV2Model
    stacked_params_mapping = [
        (".fused_qkv_a_proj_with_mqa", ".q_proj", "q"),
        (".fused_qkv_a_proj_with_mqa", ".q_a_proj", "q"),
        (".fused_qkv_a_proj_with_mqa", ".kv_a_proj_with_mqa", "kv_a"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        max_position: Optional[int] = None,
        quantization: Optional[str] = None,
        kt: Optional[KTConfig] = None,
    ) -> None:
        check_deepseek_config(config)  # the refusals ModelConfig applies, for a model built directly
        # Only a native FP8 checkpoint's own format (ModelConfig refuses online --quantization for MoE models).
        if quantization not in (None, *CHECKPOINT_FP8_FORMATS):
            raise ValueError(f"--quantization {quantization}: not supported for {type(self).__name__} (a MoE model)")
        kt_state = KTState(kt) if kt is not None else None  # one per model, handed to every MoE layer
        # Built on a CUDA device (build_model's default device): one second stream for every MoE layer's shared experts.
        on_cuda = torch.get_default_device().type == "cuda"
        shared_stream = torch.cuda.Stream() if on_cuda and config.n_shared_experts else None
        super().__init__(config, dtype, max_position, quantization, kt_state=kt_state, shared_stream=shared_stream)
        self.kt_state = kt_state

    def _without_mtp_layers(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
        """The checkpoint's tensors less the multi-token-prediction layers (index >= num_hidden_layers)."""
        first_mtp = self.config.num_hidden_layers
        skipped = 0
        for name, tensor in weights:
            parts = name.split(".")
            if len(parts) > 2 and parts[:2] == ["model", "layers"] and int(parts[2]) >= first_mtp:
                skipped += 1
                continue
            yield name, tensor
        if skipped or mtp_layer_count(self.config):
            logger.info(
                "Skipped the multi-token-prediction layer(s) from index %d (num_nextn_predict_layers=%d): "
                "%d checkpoint tensors, not part of the forward",
                first_mtp,
                mtp_layer_count(self.config),
                skipped,
            )

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        return load_moe_weights(
            self, weights, self.kt_state, self.stacked_params_mapping, select=self._without_mtp_layers
        )

    # ---- KT hybrid experts (the same contract as Qwen3-MoE's; see LlamaForCausalLM for the defaults)
    def kt_prefill_slot(self) -> Optional[KTPrefillSlot]:
        return None if self.kt_state is None else self.kt_state.prefill_slot

    def finish_loading(self) -> None:
        finish_kt_layers(self)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 / R1 and Kimi-K2: V2's layers with noaux_tc routing (the config decides, see routing_config)."""


EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
