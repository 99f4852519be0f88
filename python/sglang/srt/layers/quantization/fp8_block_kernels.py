"""The triton kernels of ``fp8_block_linear.py``: activations quantized per token and 128-column group, and the
block-scaled fp8 GEMM (both checked against that module's torch reference)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sglang.srt.layers.decode_gemm import CUBLAS_ONLY, GemmPlan
from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue
from sglang.srt.layers.quantization.block_fp8_activation import (
    ROW_MAJOR,
    Activation,
    ActivationLayout,
    BlockFp8Activation,
    empty_block_fp8_activation,
)
from sglang.srt.layers.quantization.fp8 import FP8_BLOCK as GROUP
from sglang.srt.layers.quantization.fp8_tile import store_quantized_groups

_GROUP_C: tl.constexpr = tl.constexpr(GROUP)  # a global a kernel may read


@triton.jit
def _quantize_groups_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n_rows,
    n_cols,
    stride_x,
    stride_q,
    stride_s_row,
    stride_s_group,
    BLOCK: tl.constexpr,  # the columns a program quantizes: whole 128-column groups, a power of two of them
    ROUND_BY_HAND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    first_group = tl.program_id(1) * (BLOCK // _GROUP_C)
    cols = first_group * _GROUP_C + tl.arange(0, BLOCK)
    # Padding rows (row >= n_rows) read zeros: q 0 and the smallest scale, a harmless operand.
    x = tl.load(x_ptr + row * stride_x + cols, mask=(cols < n_cols) & (row < n_rows), other=0.0).to(tl.float32)
    store_quantized_groups(
        x, first_group, n_cols, q_ptr + row * stride_q, scale_ptr + row * stride_s_row, stride_s_group, BLOCK,
        ROUND_BY_HAND,
    )  # fmt: skip


# Groups per program: a program of one 128-column group (one element per thread) made a 2,048 x 4,096 activation
# 65,536 programs and cost 42-45 us a call where its 25 MB take ~6 (the H200, benchmark/fp8_linear/block_gemms/,
# "triton" minus "gemm alone" over 36 calls); eight groups is 1,024 values per program, 8 per thread.
GROUPS_PER_PROGRAM = 8


def quantize_groups(
    x: torch.Tensor, pad_rows_to: int = 1, column_major_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_groups_reference`` of a 2-D activation with contiguous rows, in one triton kernel. For cuBLAS's
    block-scaled GEMM the rows can be padded to a multiple of ``pad_rows_to`` (zero rows) and the scales laid out
    column-major, [M, K/128] with strides (1, M), as it takes them, with no copy after."""
    m, k = x.shape
    layout = ActivationLayout(pad_rows_to, column_major_scales)
    out = empty_block_fp8_activation(m, k, x.dtype, layout, x.device)
    q, scale = out.q, out.scale
    rows, groups = scale.shape
    per_program = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(groups))
    pdl = pdl_available(x)  # a decode step runs one before every projection: its launch overlaps the kernel before
    if rows:
        _quantize_groups_kernel[(rows, triton.cdiv(groups, per_program))](
            x,
            q,
            scale,
            m,
            k,
            x.stride(0),
            q.stride(0),
            *scale.stride(),
            BLOCK=per_program * GROUP,
            ROUND_BY_HAND=in_interpreter(x),
            PDL=pdl,
            launch_pdl=pdl,
        )
    return q, scale


def handed_over_or_quantized(x: Activation, layout: ActivationLayout) -> BlockFp8Activation:
    """x quantized into ``layout`` by the kernel above, or x itself where the kernel before the projection handed it
    over quantized (it must be in that layout: the producer asked the projection, ``input_layout``)."""
    if isinstance(x, BlockFp8Activation):
        if x.layout != layout:
            raise ValueError(f"a block-fp8 activation in {x.layout} where this GEMM branch takes {layout}")
        return x
    q, scale = quantize_groups(x, layout.pad_rows_to, layout.column_major_scales)
    return BlockFp8Activation(q, scale, x.shape[0], x.dtype, layout)


# Where cuBLAS takes the shape, its block-scaled GEMM (``F.scaled_mm``) runs in place of the triton one at every row
# count: on the H200, Qwen3-8B's four projections with the activation quantization included
# (benchmark/fp8_linear/block_gemms/): 1 row 3.26 ms vs triton's 3.60, 8 rows 3.27 vs 3.48, 64 rows 3.99 vs 4.96,
# 256 rows 5.39 vs 8.96, 2,048 rows 34.2 vs 49.7, 8,192 rows 133.1 vs 196.8.
# cuBLAS takes the activation scales with a leading dimension that is a multiple of 4 (16 bytes): it refused one
# row unpadded and took 8, 64, 256, ... (benchmark/fp8_linear/block_gemms/, "rows padded to 4").
CUBLAS_ROW_MULTIPLE = 4
# cuBLAS takes the weight scale as [K/128 rounded up to 4, N/128] K-major: the checkpoint's [N/128, K/128],
# transposed, is that layout with no copy when K/128 is a multiple of 4 (every Qwen3, Llama, DeepSeek-V3 and GLM-4.5
# projection); other shapes stay on the triton GEMM.
CUBLAS_K_MULTIPLE = 4 * GROUP
CUBLAS_LAYOUT = ActivationLayout(CUBLAS_ROW_MULTIPLE, column_major_scales=True)


@functools.cache
def _has_block_scaled_mm(device: torch.device) -> bool:
    """cuBLAS's 1x128 x 128x128 block scaling through torch's named recipes: Hopper (sm90) with CUDA >= 12.9, torch
    >= 2.10 (measured on the H200 only, so no other architecture is sent there)."""
    if device.type != "cuda" or not hasattr(F, "ScalingType") or torch.version.cuda is None:
        return False
    cuda = tuple(int(v) for v in torch.version.cuda.split(".")[:2])
    return torch.cuda.get_device_capability(device) == (9, 0) and cuda >= (12, 9)


def takes_cublas_block_gemm(qweight: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether ``block_fp8_linear_gpu`` sends products with this weight to cuBLAS (else the triton GEMM)."""
    n, k = qweight.shape
    return (
        out_dtype == torch.bfloat16  # the dtype measured (the fp32 GPU tests stay on triton)
        and n % GROUP == 0
        and k % CUBLAS_K_MULTIPLE == 0
        and _has_block_scaled_mm(qweight.device)
    )


def input_layout(qweight: torch.Tensor, plan: GemmPlan, rows: int, dtype: torch.dtype) -> ActivationLayout:
    """The layout in which ``block_fp8_linear_gpu``'s branch for this many rows takes the quantized activation:
    cuBLAS's where it runs there, else row-major (the skinny kernel and the triton GEMM)."""
    if plan.config_for(rows) is None and takes_cublas_block_gemm(qweight, dtype):
        return CUBLAS_LAYOUT
    return ROW_MAJOR


def cublas_block_fp8_gemm(
    x: Activation, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The same block-scaled product as ``block_fp8_gemm`` after ``quantize_groups``, by cuBLAS: the activations
    quantized by the same kernel (rows padded, scales column-major) or handed over so, the checkpoint's weight scale
    transposed."""
    qa = handed_over_or_quantized(x, CUBLAS_LAYOUT)
    recipe = F.ScalingType
    out = F.scaled_mm(
        qa.q,
        qweight.t(),
        qa.scale,
        recipe.BlockWise1x128,
        weight_scale.t(),
        recipe.BlockWise128x128,
        output_dtype=torch.bfloat16,
    )[: qa.rows]
    return out if bias is None else out.add_(bias)


def block_fp8_linear_gpu(
    x: Activation,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    plan: GemmPlan = CUBLAS_ONLY,
) -> torch.Tensor:
    """``fp8_block_linear``'s CUDA branch for a 2-D x with contiguous rows (or handed over quantized, in
    ``input_layout``'s layout): the activation quantization, then the skinny decode kernel where ``plan`` (the
    shape's ``N x K:fp8block`` entry) has a config for x's rows, else cuBLAS where it takes the shape and dtype,
    else the triton GEMM."""
    rows = x.rows if isinstance(x, BlockFp8Activation) else x.shape[0]
    qa = handed_over_or_quantized(x, input_layout(qweight, plan, rows, x.dtype))
    config = plan.config_for(rows)
    if config is not None:
        from sglang.srt.layers.decode_gemm.kernel import skinny_linear

        return skinny_linear(qa.q, qweight, bias, config, block_scales=(qa.scale, weight_scale, qa.dtype))
    if qa.layout == CUBLAS_LAYOUT:
        return cublas_block_fp8_gemm(qa, qweight, weight_scale, bias)
    return block_fp8_gemm(qa.q, qa.scale, qweight, weight_scale, bias, qa.dtype)


@triton.jit
def _block_step(
    acc,
    a_rows,
    b_rows,
    a_scale_ptr,
    b_scale_row,
    offs_m,
    offs_k,
    mask_m,
    mask_n,
    K,
    stride_asm,
    kb,
    BLOCK_K: tl.constexpr,
):
    """One 128-wide K block: the fp8 dot in fp32, times its activation scales (per row) and weight scale."""
    cols = kb * BLOCK_K + offs_k
    mask_k = cols < K
    a = tl.load(a_rows + cols[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    b = tl.load(b_rows + cols[:, None], mask=mask_n[None, :] & mask_k[:, None], other=0.0)
    sa = tl.load(a_scale_ptr + offs_m * stride_asm + kb, mask=mask_m, other=0.0)
    sb = tl.load(b_scale_row + kb)
    return acc + tl.dot(a, b) * (sa[:, None] * sb)


@triton.jit
def _block_fp8_gemm_kernel(
    a_ptr,
    a_scale_ptr,
    b_ptr,
    b_scale_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_asm,
    stride_bn,
    stride_bsn,
    stride_cm,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    WHILE_LOOPS: tl.constexpr,
):
    """C[M, N] = block-scaled A[M, K] (fp8, scales [M, K/128]) x B[N, K]^T (fp8, scales [N/128, K/128]).
    BLOCK_K is the 128-column scale group; BLOCK_N divides 128, so a tile of N has one weight scale per K step."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_M row tiles share each column tile while it is in L2.
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_rows = a_ptr + offs_m[:, None].to(tl.int64) * stride_am
    b_rows = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn
    b_scale_row = b_scale_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if WHILE_LOOPS:  # the interpreter (see kernel_dispatch)
        kb = 0
        while kb < tl.cdiv(K, BLOCK_K):
            acc = _block_step(
                acc,
                a_rows,
                b_rows,
                a_scale_ptr,
                b_scale_row,
                offs_m,
                offs_k,
                mask_m,
                mask_n,
                K,
                stride_asm,
                kb,
                BLOCK_K,
            )
            kb += 1
    else:
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            acc = _block_step(
                acc,
                a_rows,
                b_rows,
                a_scale_ptr,
                b_scale_row,
                offs_m,
                offs_k,
                mask_m,
                mask_n,
                K,
                stride_asm,
                kb,
                BLOCK_K,
            )
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    c = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _gemm_config(m: int, on_gpu: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): small row tiles for decode batches, wide ones for prefill."""
    if not on_gpu:
        return 16, 32, 4, 1  # interpreter: small tiles keep numpy work low
    if m <= 16:
        return 16, 64, 4, 4
    if m <= 64:
        return 64, 128, 4, 3
    return 128, 128, 8, 3


def block_fp8_gemm(
    qx: torch.Tensor,
    x_scale: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The block-scaled product of quantized operands (see the module docstring), one triton kernel."""
    m, k = qx.shape
    n = qweight.shape[0]
    assert qweight.shape[1] == k and qx.stride(1) == 1 and qweight.stride(1) == 1
    assert x_scale.shape == (m, triton.cdiv(k, GROUP)) and weight_scale.shape == (
        triton.cdiv(n, GROUP),
        x_scale.shape[1],
    )
    out = torch.empty(m, n, device=qx.device, dtype=out_dtype)
    if m == 0:
        return out
    block_m, block_n, warps, stages = _gemm_config(m, qx.is_cuda)
    extra = {"num_warps": warps, "num_stages": stages} if qx.is_cuda else {}
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _block_fp8_gemm_kernel[grid](
        qx,
        x_scale,
        qweight,
        weight_scale.contiguous(),
        bias if bias is not None else qx,
        out,
        m,
        n,
        k,
        qx.stride(0),
        x_scale.stride(0),
        qweight.stride(0),
        weight_scale.shape[1],
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=GROUP,
        GROUP_M=8,
        WHILE_LOOPS=in_interpreter(qx),
        **extra,
    )
    return out
