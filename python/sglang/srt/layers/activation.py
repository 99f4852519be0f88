"""SiLU-and-mul: the gated activation of Llama/Qwen MLPs, on gate and up halves stored back to back."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] with d half the last dim (one triton kernel for 2-D CUDA x). The merged
    gate_up projection can instead apply it inside its GEMM (``MergedColumnParallelLinear.silu_and_mul``)."""
    if x.is_cuda and x.dim() == 2:
        from sglang.srt.layers import fused_elementwise

        return fused_elementwise.silu_and_mul(x)
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
