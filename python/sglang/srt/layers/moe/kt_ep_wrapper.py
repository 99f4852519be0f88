"""KTransformers-style hybrid experts (the --kt-* flags).

KTEPWrapperMethod keeps experts [0, --kt-num-gpu-experts) of a layer on the GPU and the rest in
(pinned) host memory, computed by a CPU backend while the GPU computes its share; the two partial
mixtures add up to the full layer. A prefill batch of at least --kt-gpu-prefill-token-threshold
tokens instead runs the whole layer on the GPU, in the model's one KT prefill slot (kt_prefill_slot.py).

The CPU experts run in the built-in C++ kernel (layers/moe/cpu_experts): one call per layer for every
routed (token, expert) pair, on a thread pool kept hot between layers. On CUDA the step is enqueued on
the stream (no host syncs), so hybrid decode is captured in CUDA graphs like any other decode step.

What the layers of one model share (the settings, the prefill slot, the CPU expert engine) lives in one
KTState, created with the model and handed to each layer.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from sglang.srt.configs.kt_config import KTConfig
from sglang.srt.configs.quantization_config import CheckpointQuantization
from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine, CpuExpertsLayer
from sglang.srt.layers.moe.kt_prefill_slot import KTPrefillSlot
from sglang.srt.layers.moe.layer import (
    FusedMoE,
    load_expert_from_checkpoint,
    make_moe_layer,
    moe_intermediate_partition,
)
from sglang.srt.layers.moe.topk import select_experts
from sglang.srt.layers.moe.weight_format import SharedMLPWeights

logger = logging.getLogger(__name__)
# Microseconds the CPU expert threads spin after a layer before they sleep: during decode the next layer's
# work arrives within that, and a sleeping thread takes tens of microseconds to wake (benchmark/kt_decode/).
CPU_POOL_SPIN_US = 2000


class KTState:
    """The KT machinery one model's MoE layers share; the model creates it and hands it to each layer:
    the settings, the prefill slot (made by the first layer that needs it: every layer has the same shape)
    and the engine that computes the CPU experts (one thread pool and one set of host buffers for all)."""

    def __init__(self, config: KTConfig) -> None:
        self.config = config
        self.prefill_slot: Optional[KTPrefillSlot] = None
        self.cpu_engine: Optional[CpuExpertsEngine] = None

    def ensure_prefill_slot(self, wrapper: "KTEPWrapperMethod") -> None:
        if self.prefill_slot is None:
            self.prefill_slot = KTPrefillSlot(
                wrapper.num_experts,
                wrapper.hidden_size,
                wrapper.intermediate_size,
                wrapper.params_dtype,
                self.config.method,
                wrapper.device,
            )

    def register_cpu_experts(self, wrapper: "KTEPWrapperMethod") -> CpuExpertsLayer:
        """Hand one layer's CPU experts to the engine (built with the first layer: every layer has the same
        shape), --kt-cpuinfer threads."""
        if self.cpu_engine is None:
            on_cuda = wrapper.device.type == "cuda"
            self.cpu_engine = CpuExpertsEngine(
                threads=self.config.cpu_threads,
                hidden=wrapper.hidden_size,
                inter=wrapper.intermediate_size,
                top_k=wrapper.top_k,
                num_cpu_experts=wrapper.num_experts - wrapper.num_gpu_experts,
                expert_offset=wrapper.num_gpu_experts,
                capacity=self.config.step_capacity_tokens,
                pin_memory=on_cuda,
                # On a CPU-only model the rest of the forward needs these cores: the pool sleeps at once.
                spin_us=CPU_POOL_SPIN_US if on_cuda else 0,
                int8_activations=self.config.cpu_int8_activations,
                doorbell=on_cuda,
            )
            logger.info(
                "KT CPU experts: %d threads, steps of up to %d tokens%s",
                self.config.cpu_threads,
                self.cpu_engine.capacity,
                f", handed over by {self.cpu_engine.handover}" if on_cuda else "",
            )
        layer = wrapper.cpu_layer
        return self.cpu_engine.add_layer(layer, layer.quant_method)


class KTEPWrapperMethod(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        params_dtype: torch.dtype,
        renormalize: bool,
        layer_id: int,
        kt_state: KTState,
    ) -> None:
        super().__init__()
        kt = kt_state.config
        if not 0 <= kt.num_gpu_experts <= num_experts:
            raise ValueError(f"--kt-num-gpu-experts {kt.num_gpu_experts} must be in [0, {num_experts}]")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        # With tensor parallelism every rank holds a slice of every expert (GPU, CPU and slot alike), so
        # the CPU work and the slot's reservation are split across ranks.
        self.inter_range = moe_intermediate_partition(intermediate_size)
        local_inter = self.inter_range[1] - self.inter_range[0]
        self.hidden_size, self.intermediate_size, self.params_dtype = hidden_size, local_inter, params_dtype
        self.layer_id, self.kt_state = layer_id, kt_state
        self.num_gpu_experts = kt.num_gpu_experts
        self.device = torch.empty(0).device  # the model's device (the caller's `with torch.device`)
        self.gpu_experts = (
            FusedMoE(self.num_gpu_experts, top_k, hidden_size, intermediate_size, params_dtype, kt.method, renormalize)
            if self.num_gpu_experts
            else None
        )
        # The CPU-resident experts live outside the module tree: the model's device placement never moves them.
        # A model built on the meta device (to count its bytes) allocates nothing, not even these.
        with torch.device("meta" if self.device.type == "meta" else "cpu"):
            num_cpu = num_experts - self.num_gpu_experts
            self._cpu = [make_moe_layer(num_cpu, hidden_size, local_inter, params_dtype, kt.method)] if num_cpu else []
        # Every wrapper can size the one shared slot (they are identical); none needs it when all
        # experts already live on the GPU.
        if kt.full_gpu_prefill_enabled and self.num_gpu_experts < num_experts:
            kt_state.ensure_prefill_slot(self)
        self.cpu_experts: Optional[CpuExpertsLayer] = None  # registered once the weights are in place

    @property
    def kt(self) -> KTConfig:
        return self.kt_state.config

    @property
    def cpu_layer(self) -> Optional[nn.Module]:
        return self._cpu[0] if self._cpu else None

    def expert_home(self, expert: int) -> tuple[nn.Module, int]:
        """(layer holding `expert`, its index there)."""
        if expert < self.num_gpu_experts:
            return self.gpu_experts, expert
        return self.cpu_layer, expert - self.num_gpu_experts

    # ------------------------------------------------------------ loading
    def weight_loader(self, param, loaded_weight: torch.Tensor, shard_id: str, expert_id: int) -> None:
        if expert_id < self.num_gpu_experts:
            self.gpu_experts.weight_loader(param, loaded_weight, shard_id, expert_id)  # slices itself
            return
        layer, idx = self.expert_home(expert_id)
        load_expert_from_checkpoint(layer, layer.quant_method, self.inter_range, idx, shard_id, loaded_weight, param)

    def takes_checkpoint_experts(self, quant: CheckpointQuantization) -> bool:
        """--kt-method FP8 holds a native block-FP8 checkpoint's experts as they are, FP8_PERCHANNEL a per-channel
        (or per-tensor) one's, INT4 of the checkpoint's group size a pack-quantized one's, GPU and CPU ones alike:
        the CPU kernel reads the checkpoint's own codes and scales, no BF16 round trip. Asked of the layer that
        holds them (both hold --kt-method's format)."""
        layer = self.cpu_layer if self.cpu_layer is not None else self.gpu_experts
        return layer.quant_method.holds_checkpoint(quant)

    def finish_loading(self) -> None:
        """Pin the host experts when the full-GPU slot will copy them in (DMA), then hand them to the CPU
        kernel, which keeps their addresses: they must not move after this."""
        layer = self.cpu_layer
        if layer is None:
            return
        if self.kt_state.prefill_slot is not None and torch.cuda.is_available():
            for p in layer.parameters():
                p.data = p.data.pin_memory()
        self.cpu_experts = self.kt_state.register_cpu_experts(self)

    # --------------------------------------------------------------- forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        is_prefill: bool = False,
        num_real_tokens: Optional[torch.Tensor] = None,
        topk_output: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        shared: Optional[SharedMLPWeights] = None,
    ) -> torch.Tensor:
        """num_real_tokens: [1] int32 on the device, the rows of a padded CUDA-graph batch that are real.
        topk_output: (weights, ids) the model routed itself (DeepSeek), as FusedMoE.forward takes it. `shared`:
        FusedMoE.forward's; the hybrid experts never take one (the model keeps its shared MLP apart under KT)."""
        if shared is not None:
            raise ValueError("KT's hybrid experts run no shared MLP as slots (models/deepseek_v2.py keeps it apart)")
        if topk_output is not None:
            topk_weights, topk_ids = topk_output
        else:
            topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        slot = self.kt_state.prefill_slot
        if slot is not None and is_prefill and hidden_states.shape[0] >= self.kt.gpu_prefill_token_threshold:
            layer = slot.acquire()
            if layer is not None:
                slot.load_from(self)
                return layer.quant_method.apply(layer, hidden_states, topk_weights, topk_ids)
        return self.hybrid_forward(hidden_states, topk_weights, topk_ids, num_real_tokens)

    def hybrid_forward(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        num_real_tokens: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """GPU-resident experts on the model's device plus the CPU experts in the kernel: the CPU's fp32
        mixture is added into the GPU experts' output (in fp32, rounded once). On CUDA the CPU step is
        enqueued around the GPU experts' kernels, so both compute at once and nothing waits on the host."""
        g = self.num_gpu_experts

        def gpu_experts() -> torch.Tensor:
            if self.gpu_experts is None:
                return torch.zeros_like(x)
            gpu_ids = torch.where(topk_ids < g, topk_ids, -1)
            return self.gpu_experts.quant_method.apply(self.gpu_experts, x, topk_weights, gpu_ids)

        if self.cpu_layer is None:
            return gpu_experts()
        if self.cpu_experts is None:  # a module used before the model finished loading (tests)
            self.cpu_experts = self.kt_state.register_cpu_experts(self)
        engine = self.kt_state.cpu_engine
        if x.is_cuda:
            return engine.run_on_stream(self.cpu_experts, x, topk_weights, topk_ids, num_real_tokens, gpu_experts)
        out = gpu_experts()
        out += engine.run_on_host(self.cpu_experts, x, topk_weights, topk_ids)
        return out


def build_moe_experts(
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    params_dtype: torch.dtype,
    renormalize: bool,
    layer_id: int,
    kt_state: Optional[KTState],
    quant_method: str = "BF16",
) -> nn.Module:
    """`quant_method`: the GPU experts' format without KT (a native block-FP8 checkpoint's: "FP8"); with KT,
    --kt-method decides."""
    if kt_state is None:
        return FusedMoE(
            num_experts,
            top_k,
            hidden_size,
            intermediate_size,
            params_dtype,
            quant_method,
            renormalize,
            prefix=f"layers.{layer_id}.mlp.experts",
        )
    return KTEPWrapperMethod(
        num_experts, top_k, hidden_size, intermediate_size, params_dtype, renormalize, layer_id, kt_state
    )
