"""FP8 (e4m3) dense linear layers, quantized online from a bf16/fp16 checkpoint (``--quantization fp8``).

Weights get one fp32 scale per output channel (row), computed when each checkpoint shard is loaded, so a
row's scale depends only on that row: column-parallel shards, merged gate/up and q/k/v slices quantize on
their own, and a row-parallel shard scales its own slice of K (each rank dequantizes its partial sum before
the all-reduce). Activations get one scale per token, computed at every call. The GEMM is
``torch._scaled_mm`` with row-wise scales: out[m, n] = sum_k qx[m, k] qw[n, k] * sx[m] * sw[n], accumulated
in fp32 on the tensor cores at twice the bf16 rate (Hopper), reading half the weight bytes. At decode batch
sizes ``_scaled_mm`` reads the weights at a third of the copy bandwidth for most shapes (measured on the H200,
``benchmark/fp8_linear/``), so there the tuned table may send the same fp8 operands to the skinny decode
kernel instead (``decode_gemm``, entries keyed ``N x K:fp8``). Off the GPU (tests) the product is computed
from the dequantized operands in fp32: the same quantization, any torch build.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.decode_gemm import CUBLAS_ONLY, GemmPlan, skinny_config
from sglang.srt.layers.quantization.fp8 import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_SCALE


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, C] -> (fp8 [R, C], fp32 scale [R, 1]) with x ~= fp8 * scale, one scale per row (torch ops)."""
    xf = x.float()
    # Times the reciprocal, not divided: what torch does for a scalar divisor on CUDA anyway, and what the
    # activation kernel does, so the three agree to the bit.
    scale = (xf.abs().amax(dim=-1, keepdim=True) * INV_FP8_MAX).clamp(min=MIN_SCALE)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    plan: GemmPlan = CUBLAS_ONLY,
) -> torch.Tensor:
    """``F.linear(x, qweight * weight_scale, bias)`` in x's dtype, x quantized per token.

    qweight: [N, K] float8_e4m3fn, row-major (its transpose is the column-major operand _scaled_mm needs);
    weight_scale: [N, 1] fp32; plan: the shape's tuned choices (skinny kernel or _scaled_mm per row count).
    Leading dims of x are flattened and restored.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if not x2.is_cuda:
        qx, x_scale = quantize_rows(x2)
        out = (qx.float() @ qweight.float().t()) * x_scale * weight_scale.view(1, -1)
        out = (out if bias is None else out + bias.float()).to(x.dtype)
        return out.view(*lead, qweight.shape[0])
    # Imported here: triton is only installed with the GPU extras.
    from sglang.srt.layers.quantization.fp8_activation_kernel import quantize_activations

    qx, x_scale = quantize_activations(x2)
    config = skinny_config(qx, plan)
    if config is not None:
        from sglang.srt.layers.decode_gemm.kernel import skinny_linear

        out = skinny_linear(qx, qweight, bias, config, scales=(x_scale, weight_scale, x.dtype))
    else:
        out = torch._scaled_mm(
            qx, qweight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), bias=bias, out_dtype=x.dtype
        )
    return out.view(*lead, qweight.shape[0])


def fp8_linear_silu_and_mul(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None, silu_plan: GemmPlan
) -> torch.Tensor | None:
    """``silu(gate) * up`` of ``fp8_linear(x, [gate; up] ...)``: the activation quantization, then the skinny kernel
    with SiLU-and-mul in its epilogue, where ``silu_plan`` (``N x K:fp8:silu``) has a config for x's rows;
    None where it has not (the caller runs ``fp8_linear``, then the activation)."""
    config = skinny_config(x, silu_plan) if x.is_cuda else None
    if config is None:
        return None
    from sglang.srt.layers.decode_gemm.kernel import skinny_linear
    from sglang.srt.layers.quantization.fp8_activation_kernel import quantize_activations

    qx, x_scale = quantize_activations(x)
    return skinny_linear(qx, qweight, bias, config, scales=(x_scale, weight_scale, x.dtype), silu_and_mul=True)
