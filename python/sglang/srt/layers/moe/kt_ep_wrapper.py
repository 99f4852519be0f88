"""KTransformers-style hybrid experts (the --kt-* flags), and the full-GPU prefill slot.

KTEPWrapperMethod keeps experts [0, --kt-num-gpu-experts) of a layer on the GPU and the rest in
(pinned) host memory, computed by a CPU backend while the GPU computes its share; the two partial
mixtures add up to the full layer. A prefill batch of at least --kt-gpu-prefill-token-threshold
tokens instead runs the whole layer on the GPU: one SharedFullContext (a complete MoE layer in the
layer's quant method) is built on first use and every layer streams its experts into it.

The slot's size is known before any KV is planned: moe_layer_bytes builds the very same
layer on the meta device and sums its parameter bytes, and the model reports it as a memory
reservation, so both KV sizing paths keep it free.

The CPU experts run in the built-in C++ kernel (layers/moe/cpu_experts): one call per layer for every
routed (token, expert) pair, on a thread pool kept hot between layers. On CUDA the step is enqueued on
the stream with host functions (no host syncs), so hybrid decode is captured in CUDA graphs like any
other decode step.

What the layers of one model share (the settings, the slot, whether the full-GPU path was switched
off, the CPU expert engine) lives in one KTState, created with the model and handed to each layer.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import nn

from sglang.srt.environ import envs
from sglang.srt.layers.moe.cpu_experts import CpuExpertsEngine, CpuExpertsLayer
from sglang.srt.layers.moe.layer import FusedMoE, load_expert_from_checkpoint, moe_intermediate_partition
from sglang.srt.layers.moe.topk import select_experts
from sglang.srt.layers.quantization import get_moe_method

logger = logging.getLogger(__name__)
RESERVATION_NAME = "kt_full_gpu_prefill_slot"
# Tokens one CPU step takes at least (its host buffers); longer prefills go through in slices of this size.
MIN_STEP_CAPACITY_TOKENS = 1024


@dataclass(frozen=True)
class KTConfig:
    method: str
    weight_path: Optional[str]
    cpuinfer: Optional[int]
    threadpool_count: int
    num_gpu_experts: int
    max_deferred_experts_per_token: Optional[int]
    gpu_prefill_token_threshold: Optional[int]
    # Tokens one CPU step takes (its host buffers): at least the largest captured decode batch, so a graph
    # replay is one step; longer prefills go through in slices of this many tokens.
    step_capacity_tokens: int = MIN_STEP_CAPACITY_TOKENS

    @classmethod
    def from_server_args(cls, sa) -> Optional["KTConfig"]:
        """KT is on when --kt-weight-path, --kt-num-gpu-experts or --kt-gpu-prefill-token-threshold is given."""
        if sa.kt_weight_path is None and sa.kt_num_gpu_experts is None and sa.kt_gpu_prefill_token_threshold is None:
            return None
        return cls(
            method=sa.kt_method.upper(),
            weight_path=sa.kt_weight_path,
            # Each tensor-parallel rank runs its own pool: by default they share the CPUs out.
            cpuinfer=sa.kt_cpuinfer or max(1, len(os.sched_getaffinity(0)) // sa.tp_size),
            threadpool_count=sa.kt_threadpool_count,
            num_gpu_experts=sa.kt_num_gpu_experts or 0,
            max_deferred_experts_per_token=sa.kt_max_deferred_experts_per_token,
            gpu_prefill_token_threshold=sa.kt_gpu_prefill_token_threshold,
            step_capacity_tokens=max(MIN_STEP_CAPACITY_TOKENS, sa.cuda_graph_max_bs or 0),
        )

    def cpu_threads(self) -> int:
        """--kt-cpuinfer (from_server_args fills in the default), else every CPU this process may run on."""
        return self.cpuinfer or len(os.sched_getaffinity(0))


def make_moe_layer(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str) -> nn.Module:
    """An empty module holding one MoE layer's expert parameters in `method`'s layout, on the current
    default device. The full-GPU slot and its meta-device sizing both come from here."""
    layer = nn.Module()
    quant = get_moe_method(method)
    quant.create_weights(layer, num_experts, hidden, inter, dtype)
    layer.quant_method = quant
    return layer


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def moe_layer_bytes(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str) -> int:
    """Exact parameter bytes of one MoE layer in `method`'s layout: built on the meta device (allocates nothing)."""
    with torch.device("meta"):
        return param_bytes(make_moe_layer(num_experts, hidden, inter, dtype, method))


class SharedFullContext:
    """One complete MoE layer on the GPU, shared by every layer's full-GPU prefill (built lazily)."""

    def __init__(self, num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str, device) -> None:
        with torch.device(device):
            self.layer = make_moe_layer(num_experts, hidden, inter, dtype, method)
        self.loaded_layer_id: Optional[int] = None

    @classmethod
    def over_memory(
        cls, memory: torch.Tensor, num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str
    ) -> "SharedFullContext":
        """The same layer with its parameters laid over `memory` (bytes lent from the KV pool's tail):
        built on the meta device, then each parameter becomes a view, packed without gaps (widest
        elements first, so every view is aligned to its element size), so exactly moe_layer_bytes fit."""
        ctx = cls.__new__(cls)
        with torch.device("meta"):
            ctx.layer = make_moe_layer(num_experts, hidden, inter, dtype, method)
        params = sorted(ctx.layer.named_parameters(), key=lambda kv: -kv[1].element_size())
        need = sum(p.numel() * p.element_size() for _, p in params)
        if need > memory.numel():
            raise ValueError(f"the lent memory ({memory.numel()} bytes) cannot hold the slot ({need} bytes)")
        offset = 0
        for name, p in params:
            n = p.numel() * p.element_size()
            view = memory[offset : offset + n].view(p.dtype).view(p.shape)
            ctx.layer.register_parameter(name, nn.Parameter(view, requires_grad=False))
            offset += n
        ctx.loaded_layer_id = None
        return ctx

    def load_from(self, wrapper: "KTEPWrapperMethod") -> None:
        """Stream all of `wrapper`'s experts in: GPU-resident ones device to device, the rest from pinned host memory."""
        if self.loaded_layer_id == wrapper.layer_id:
            return
        quant = self.layer.quant_method
        for e in range(wrapper.num_experts):
            src, idx = wrapper.expert_home(e)
            quant.copy_expert_from(self.layer, e, src, idx)
        self.loaded_layer_id = wrapper.layer_id


class KTState:
    """The KT machinery one model's MoE layers share; the model creates it and hands it to each layer.

    It owns the settings, the full-GPU prefill slot (built on the first qualifying prompt), whether
    that path was switched off (the slot did not fit: no later prefill tries again), and the engine
    that computes the CPU experts (one thread pool and one set of host buffers for all layers)."""

    def __init__(self, config: KTConfig) -> None:
        self.config = config
        self.full_gpu_slot: Optional[SharedFullContext] = None
        self.full_gpu_disabled = False
        self.cpu_engine: Optional[CpuExpertsEngine] = None
        # Elastic slot (post-capture path): the slot lives in memory the scheduler lends from the KV pool's
        # tail for the prefills that need it; while nothing is lent, those prefills take the hybrid path.
        self.elastic = False
        self.lent_memory: Optional[torch.Tensor] = None

    def use_lent_memory(self) -> None:
        """From now on the slot is built only over memory handed in with lend() (never allocated)."""
        self.elastic = True
        self.release_full_gpu_slot()

    def lend(self, memory: torch.Tensor) -> None:
        self.lent_memory = memory
        self.full_gpu_slot = None

    def reclaim(self) -> None:
        """The lent memory goes back to the KV pool: drop every view of it first."""
        self.full_gpu_slot = None
        self.lent_memory = None

    def register_cpu_experts(self, wrapper: "KTEPWrapperMethod") -> CpuExpertsLayer:
        """Hand one layer's CPU experts to the engine (built with the first layer: every layer has the same
        shape). --kt-cpuinfer threads, spinning SGLANG_KT_CPU_SPIN_US between layers."""
        if self.cpu_engine is None:
            threads = self.config.cpu_threads()
            self.cpu_engine = CpuExpertsEngine(
                threads=threads,
                hidden=wrapper.hidden_size,
                inter=wrapper.intermediate_size,
                top_k=wrapper.top_k,
                num_cpu_experts=wrapper.num_experts - wrapper.num_gpu_experts,
                expert_offset=wrapper.num_gpu_experts,
                capacity=self.config.step_capacity_tokens,
                pin_memory=wrapper.device.type == "cuda",
                # On a CPU-only model the rest of the forward needs these cores: the pool sleeps at once.
                spin_us=envs.SGLANG_KT_CPU_SPIN_US.get() if wrapper.device.type == "cuda" else 0,
                zero_copy=envs.SGLANG_KT_CPU_ZERO_COPY.get(),
                int8_activations=envs.SGLANG_KT_CPU_INT8_ACTIVATIONS.get(),
                doorbell=wrapper.device.type == "cuda" and envs.SGLANG_KT_CPU_DOORBELL.get(),
            )
            logger.info(
                "KT CPU experts: %d threads, steps of up to %d tokens%s",
                threads,
                self.cpu_engine.capacity,
                f", handed over by {self.cpu_engine.handover}" if wrapper.device.type == "cuda" else "",
            )
        layer = wrapper.cpu_layer
        return self.cpu_engine.add_layer(layer, layer.quant_method)

    def full_gpu_context(self, wrapper: "KTEPWrapperMethod") -> Optional[SharedFullContext]:
        """The one slot, built on first use; None (and the path switched off) when it does not fit."""
        if self.full_gpu_slot is not None:
            return self.full_gpu_slot
        if self.elastic:
            if self.lent_memory is None:
                return None  # the scheduler could not lend the tail for this batch: it runs the hybrid path
            self.full_gpu_slot = SharedFullContext.over_memory(
                self.lent_memory,
                wrapper.num_experts,
                wrapper.hidden_size,
                wrapper.intermediate_size,
                wrapper.params_dtype,
                self.config.method,
            )
            return self.full_gpu_slot
        need = wrapper.full_gpu_prefill_reservation_bytes()
        try:
            if wrapper.device.type == "cpu":
                from sglang.srt.utils.memory import host_available_memory_bytes

                if host_available_memory_bytes() < need:
                    raise MemoryError(f"{need} bytes requested, {host_available_memory_bytes()} available")
            self.full_gpu_slot = SharedFullContext(
                wrapper.num_experts,
                wrapper.hidden_size,
                wrapper.intermediate_size,
                wrapper.params_dtype,
                self.config.method,
                wrapper.device,
            )
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            self.full_gpu_disabled = True
            logger.error(
                "Cannot allocate the full-GPU prefill slot (%.2f GiB): %s. Prefills use the hybrid CPU/GPU path from "
                "now on. Raise --mem-fraction-static, or pass --kt-gpu-prefill-token-threshold 0 to turn the "
                "full-GPU path off.",
                need / (1 << 30),
                e,
            )
        return self.full_gpu_slot

    def release_full_gpu_slot(self) -> int:
        """Free the slot if it was built (the next qualifying prefill builds it again); returns its
        parameter bytes. The post-capture probe uses it: the slot is covered by its reservation, so the
        bytes it held during the probe are not activation memory."""
        freed = 0 if self.full_gpu_slot is None else param_bytes(self.full_gpu_slot.layer)
        self.full_gpu_slot = None
        return freed


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
        self.registers_prefill_slot = bool(kt.gpu_prefill_token_threshold) and self.num_gpu_experts < num_experts
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

    def takes_checkpoint_fp8(self) -> bool:
        """--kt-method FP8 holds a native block-FP8 checkpoint's experts as they are, GPU and CPU ones alike:
        the CPU kernel reads the checkpoint's own codes and scales, no BF16 round trip."""
        return self.kt.method == "FP8"

    def finish_loading(self) -> None:
        """Pin the host experts when the full-GPU slot will copy them in (DMA), then hand them to the CPU
        kernel, which keeps their addresses: they must not move after this."""
        layer = self.cpu_layer
        if layer is None:
            return
        if self.registers_prefill_slot and torch.cuda.is_available():
            for p in layer.parameters():
                p.data = p.data.pin_memory()
        self.cpu_experts = self.kt_state.register_cpu_experts(self)

    # ---------------------------------------------------------- reservation
    def full_gpu_prefill_reservation_bytes(self) -> int:
        """Exact bytes of the shared full-GPU slot on this rank: every expert, this rank's slice of each."""
        return moe_layer_bytes(
            self.num_experts, self.hidden_size, self.intermediate_size, self.params_dtype, self.kt.method
        )

    # --------------------------------------------------------------- forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        is_prefill: bool = False,
        num_real_tokens: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """num_real_tokens: [1] int32 on the device, the rows of a padded CUDA-graph batch that are real."""
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        if self._wants_full_gpu(hidden_states.shape[0], is_prefill):
            ctx = self.kt_state.full_gpu_context(self)
            if ctx is not None:
                ctx.load_from(self)
                return ctx.layer.quant_method.apply(ctx.layer, hidden_states, topk_weights, topk_ids)
        return self.hybrid_forward(hidden_states, topk_weights, topk_ids, num_real_tokens)

    def _wants_full_gpu(self, num_tokens: int, is_prefill: bool) -> bool:
        threshold = self.kt.gpu_prefill_token_threshold
        return (
            is_prefill
            and threshold is not None
            and threshold > 0
            and num_tokens >= threshold
            and not self.kt_state.full_gpu_disabled
            and self.num_gpu_experts < self.num_experts
        )

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


def full_gpu_prefill_reservations(model: nn.Module) -> Dict[str, int]:
    """The model's reservation: one shared slot when any KT layer has the threshold set (else none)."""
    for module in model.modules():
        if isinstance(module, KTEPWrapperMethod) and module.registers_prefill_slot:
            return {RESERVATION_NAME: module.full_gpu_prefill_reservation_bytes()}
    return {}
