"""Gated MLP activations on gate and up halves stored back to back: SiLU-and-mul (Llama/Qwen), GELU(tanh)-and-mul
(Gemma)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers import kernel_dispatch
from sglang.srt.layers.quantization.block_fp8_activation import Activation, ActivationLayout
from sglang.srt.layers.quantization.fp8_block_linear import quantize_activation


def silu_and_mul(x: torch.Tensor, quantize: Optional[ActivationLayout] = None) -> Activation:
    """silu(x[..., :d]) * x[..., d:] with d half the last dim (one triton kernel for 2-D CUDA x). The merged
    gate_up projection can instead apply it inside its GEMM (``MergedColumnParallelLinear.silu_and_mul``).
    ``quantize`` (2-D x): the result handed to the block-fp8 projection after it, quantized in that layout (on the GPU
    by the same kernel, as it writes the result)."""
    if kernel_dispatch.runs_kernel(x) and x.dim() == 2:
        from sglang.srt.layers import fused_elementwise

        return fused_elementwise.silu_and_mul(x, quantize)
    d = x.shape[-1] // 2
    y = F.silu(x[..., :d]) * x[..., d:]
    return y if quantize is None else quantize_activation(y, quantize)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(x[..., :d], tanh approximation) * x[..., d:]: Gemma's GeGLU (`hidden_activation` gelu_pytorch_tanh, which
    transformers computes with torch's own tanh-approximated gelu, as here; one triton kernel for 2-D CUDA x)."""
    if kernel_dispatch.runs_kernel(x) and x.dim() == 2:
        from sglang.srt.layers import fused_elementwise

        return fused_elementwise.gelu_tanh_and_mul(x)
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]
