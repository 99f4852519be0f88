"""Triton fused-MoE kernels (GPU; run in the triton interpreter on CPU tensors in tests)."""

from sglang.srt.layers.moe.fused_moe_triton.fused_moe import (
    AlignedRouting,
    MoEKernelConfig,
    default_config,
    fused_experts_triton,
    invoke_moe_gemm,
    moe_align_block_size,
)

__all__ = [
    "AlignedRouting",
    "MoEKernelConfig",
    "default_config",
    "fused_experts_triton",
    "invoke_moe_gemm",
    "moe_align_block_size",
]
