"""RMSNorm, computed in fp32 like the reference implementation, with an optional fused residual add."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import nn

from sglang.srt.layers import kernel_dispatch
from sglang.srt.layers.quantization.block_fp8_activation import Activation, ActivationLayout
from sglang.srt.layers.quantization.fp8_block_linear import quantize_activation


def rms_normed(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in torch, rounded as transformers' (the normalised value in x's dtype, then times the weight)."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def gemma_rms_normed(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm in torch, as transformers' Gemma2/Gemma3 RMSNorm: the checkpoint stores w and the scale is
    (1 + w); the whole product is taken in fp32 and rounded once (Llama rounds the normalised value first)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (1.0 + weight.float())).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normed(x, self.weight, self.variance_epsilon)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None, quantize: Optional[ActivationLayout] = None
    ) -> Union[Activation, Tuple[Activation, torch.Tensor]]:
        """Without a residual: norm(x). With one: (norm(x + residual), x + residual).

        On the GPU one fused kernel does it, updating `residual` in place and writing the result
        over `x` (both are temporaries of the decoder loop). ``quantize`` (2-D x): the norm is handed to the
        block-fp8 projection that reads it, quantized in that layout (on the GPU by the same kernel, in place of
        writing it over x)."""
        if kernel_dispatch.runs_kernel(x):
            from sglang.srt.layers.fused_elementwise import rmsnorm

            out = x if residual is not None and quantize is None else None
            normed = rmsnorm(x, self.weight, self.variance_epsilon, residual=residual, out=out, quantize=quantize)
            return normed if residual is None else (normed, residual)
        if residual is not None:
            residual = x = x + residual
        normed = self._norm(x) if quantize is None else quantize_activation(self._norm(x), quantize)
        return normed if residual is None else (normed, residual)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm (``gemma_rms_normed``): torch on the CPU (transformers' bits), one kernel on the GPU."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=params_dtype), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The norm over the last dim (any leading shape on the CPU; on the GPU [T, D] rows take the kernel)."""
        if kernel_dispatch.runs_kernel(x) and x.dim() == 2 and x.stride(1) == 1:
            from sglang.srt.layers.fused_elementwise import gemma_rmsnorm

            return gemma_rmsnorm(x, self.weight, self.variance_epsilon)
        return gemma_rms_normed(x, self.weight, self.variance_epsilon)


def sandwich_norms(
    block_out: torch.Tensor, residual: torch.Tensor, post_norm: GemmaRMSNorm, next_norm: GemmaRMSNorm
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gemma 2/3 between two blocks: the stream gets the block's output post-normed (``residual + post_norm(x)``)
    and the next block reads ``next_norm`` of it. Returns (that input, the stream); on the GPU one kernel, the stream
    updated in place (the decoder loop's temporary), on the CPU torch's ops, transformers' bits."""
    if kernel_dispatch.runs_kernel(block_out) and block_out.dim() == 2 and block_out.stride(1) == 1:
        from sglang.srt.layers.fused_elementwise import gemma_rmsnorm

        sandwich = (residual, post_norm.weight, post_norm.variance_epsilon)
        return gemma_rmsnorm(block_out, next_norm.weight, next_norm.variance_epsilon, sandwich=sandwich), residual
    residual = residual + post_norm(block_out)
    return next_norm(residual), residual
