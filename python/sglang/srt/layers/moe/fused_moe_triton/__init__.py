"""Triton fused-MoE kernels (GPU; run in the triton interpreter on CPU tensors in tests)."""

from sglang.srt.layers.moe.fused_moe_triton.fused_moe import (
    MoEGemmConfigs,
    MoEKernelConfig,
    default_configs,
    fused_experts_triton,
    invoke_moe_gemm,
    moe_sum,
)
from sglang.srt.layers.moe.fused_moe_triton.moe_align import (
    AlignedRouting,
    moe_align_block_size,
    moe_align_block_size_torch,
    moe_align_block_size_triton,
)

__all__ = [
    "AlignedRouting",
    "MoEGemmConfigs",
    "MoEKernelConfig",
    "default_configs",
    "fused_experts_triton",
    "invoke_moe_gemm",
    "moe_align_block_size",
    "moe_align_block_size_torch",
    "moe_align_block_size_triton",
    "moe_sum",
]
