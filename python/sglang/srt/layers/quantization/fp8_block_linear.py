"""Block-scaled FP8 dense linear layers: the native checkpoints of DeepSeek-V3/R1, Qwen3-*-FP8, GLM-4.5-FP8.

The weight is float8_e4m3fn [N, K] with one fp32 scale per 128x128 block, ``weight_scale_inv`` [ceil(N/128),
ceil(K/128)], as the checkpoint stores it (weight = q x scale_inv; never re-quantized). Activations are
quantized at every call with one scale per token and 128-column group (DeepSeek-V3's recipe), so each
128-wide step of K has exactly one activation scale per row and one weight scale per 128 output columns:

    out[m, n] = sum_kb  sx[m, kb] * sw[n // 128, kb] * sum_{k in kb} qx[m, k] qw[n, k]

The GPU quantizes the activations in one triton kernel (``fp8_block_kernels.py``), or the kernel before the
projection does as it writes them (the RMSNorm before qkv_proj and gate_up_proj, SiLU-and-mul before down_proj,
the decode attention before o_proj: ``BlockFp8Activation``, one launch and one bf16 round trip less each), then
runs the GEMM (fp8 x fp8 dots accumulated in fp32 per 128-wide K block, scaled, summed): at decode sizes the
skinny decode kernel where the GPU's tuned table has an ``N x K:fp8block`` entry for the row count
(``decode_gemm``), else cuBLAS's block-scaled GEMM (``F.scaled_mm``) where the GPU, shape and dtype allow
(measured faster than the triton GEMM at every row count), else a triton kernel. The CPU computes the same sum
from the dequantized operands in fp32 (tests; on the CPU the engine dequantizes such checkpoints at load instead).
"""

from __future__ import annotations

import torch

from sglang.srt.layers.decode_gemm import add_norm_config
from sglang.srt.layers.decode_gemm.table import CUBLAS_ONLY, GemmPlan
from sglang.srt.layers.quantization.block_fp8_activation import (
    ROW_MAJOR,
    Activation,
    ActivationLayout,
    BlockFp8Activation,
    empty_block_fp8_activation,
)
from sglang.srt.layers.quantization.fp8 import FP8_BLOCK, FP8_DTYPE, FP8_MAX
from sglang.srt.layers.quantization.fp8_linear import INV_FP8_MAX, MIN_SCALE

GROUP = FP8_BLOCK  # K columns per activation scale, and the weight's block edge


def quantize_activation(x: torch.Tensor, layout: ActivationLayout = ROW_MAJOR) -> BlockFp8Activation:
    """A 2-D activation quantized per token and 128-column group into ``layout``: the triton kernel on the GPU,
    the torch reference elsewhere (the same bits)."""
    if x.is_cuda:
        from sglang.srt.layers.quantization.fp8_block_kernels import quantize_groups

        q, scale = quantize_groups(x, layout.pad_rows_to, layout.column_major_scales)
        return BlockFp8Activation(q, scale, x.shape[0], x.dtype, layout)
    out = empty_block_fp8_activation(x.shape[0], x.shape[1], x.dtype, layout, x.device)
    q, scale = quantize_groups_reference(x)
    out.q.zero_()[: x.shape[0]] = q
    out.scale.fill_(MIN_SCALE)[: x.shape[0]] = scale  # padding rows: q 0 and the smallest scale, as the kernel
    return out


def quantize_groups_reference(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (fp8 [M, K], fp32 scale [M, ceil(K/group)]): x ~= q * scale within each row's group (torch)."""
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.nn.functional.pad(x.float(), (0, groups * group - k)).view(m, groups, group)
    # Times the reciprocal and a clamped floor, as quantize_rows and the kernel: all three agree to the bit.
    scale = (padded.abs().amax(dim=-1) * INV_FP8_MAX).clamp(min=MIN_SCALE)
    q = (padded / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(m, groups * group)[:, :k]
    return q.contiguous(), scale


def dequantize_blocks(qweight: torch.Tensor, scale: torch.Tensor, block: int = GROUP) -> torch.Tensor:
    """fp8 [N, K] with [ceil(N/block), ceil(K/block)] scales -> fp32 [N, K]."""
    n, k = qweight.shape
    full = scale.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return qweight.float() * full


def block_fp8_matmul_reference(
    qx: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor
) -> torch.Tensor:
    """The block-scaled product in fp32 from the dequantized operands: what the kernel computes."""
    k = qx.shape[1]
    x = qx.float() * x_scale.repeat_interleave(GROUP, 1)[:, :k]
    return x @ dequantize_blocks(qweight, weight_scale).t()


def fp8_block_linear(
    x: Activation,
    qweight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    bias: torch.Tensor | None,
    plan: GemmPlan = CUBLAS_ONLY,
) -> torch.Tensor:
    """``F.linear(x, dequantized weight, bias)`` in x's dtype with x quantized per token and 128-column group (or
    handed over quantized: a ``BlockFp8Activation`` in the layout the GPU's branch for its rows takes).
    Leading dims of x are flattened and restored. plan: the weight shape's tuned decode choices (GPU only)."""
    if isinstance(x, BlockFp8Activation):
        if not x.q.is_cuda:
            q, scale = x.q[: x.rows], x.scale[: x.rows]
            out = block_fp8_matmul_reference(q, scale, qweight, weight_scale_inv)
            return (out if bias is None else out + bias.float()).to(x.dtype)
        from sglang.srt.layers.quantization.fp8_block_kernels import block_fp8_linear_gpu

        return block_fp8_linear_gpu(x, qweight, weight_scale_inv, bias, plan)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if not x2.is_cuda:
        qx, sx = quantize_groups_reference(x2)
        out = block_fp8_matmul_reference(qx, sx, qweight, weight_scale_inv)
        out = (out if bias is None else out + bias.float()).to(x.dtype)
    else:
        # Imported here: triton is only installed with the GPU extras.
        from sglang.srt.layers.quantization.fp8_block_kernels import block_fp8_linear_gpu

        out = block_fp8_linear_gpu(x2, qweight, weight_scale_inv, bias, plan)
    return out.view(*lead, qweight.shape[0])


def fp8_block_linear_add_rmsnorm(
    x: Activation,
    qweight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    plan: GemmPlan,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    addend: torch.Tensor | None = None,
    quantize: ActivationLayout | None = None,
) -> torch.Tensor | BlockFp8Activation | None:
    """``fused_elementwise.rmsnorm(fp8_block_linear(x, ...) [+ addend], norm_weight, eps, residual=residual)``
    (decode_gemm.linear_add_rmsnorm's contract) with the adds and the norm in the skinny GEMM's split-K sum kernel,
    where the plan (the ``N x K:fp8block`` entry) has a config for x's rows that splits K; None where it has not (the
    caller runs the GEMM, the add, then the norm kernel: the same bits). x [M, K] with contiguous rows, or handed
    over quantized (row-major: the skinny kernel's layout). ``quantize``: the sum kernel also quantizes the norm's
    output per token and 128-column group into that layout, for the block-fp8 projection that reads it, and returns
    that instead of the bf16 rows."""
    from sglang.srt.layers.decode_gemm.kernel import skinny_linear
    from sglang.srt.layers.quantization.fp8_block_kernels import handed_over_or_quantized

    probe = x.q[: x.rows] if isinstance(x, BlockFp8Activation) else x
    config = add_norm_config(probe, plan, qweight.shape[0], residual, norm_weight, addend)
    if config is None:
        return None
    qa = handed_over_or_quantized(x, ROW_MAJOR)
    return skinny_linear(
        qa.q,
        qweight,
        None,
        config,
        block_scales=(qa.scale, weight_scale_inv, qa.dtype),
        add_norm=(residual, norm_weight, eps),
        addend=addend,
        quantize=quantize,
    )
