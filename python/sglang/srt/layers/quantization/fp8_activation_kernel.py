"""Per-token fp8 quantization of an activation in one triton kernel: the GPU's ``quantize_rows``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.pdl import pdl_available, pdl_prologue
from sglang.srt.layers.quantization.fp8 import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_SCALE


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n_cols,
    stride_x,
    stride_q,
    FP8_MAX_C: tl.constexpr,
    INV_FP8_MAX_C: tl.constexpr,
    MIN_SCALE_C: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    # As quantize_rows: times the reciprocal, then a correctly rounded division (triton's `/` is approximate).
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * INV_FP8_MAX_C, MIN_SCALE_C)
    q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX_C, FP8_MAX_C)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` of a 2-D activation with K-contiguous rows, in one kernel (the GPU's path)."""
    rows, cols = x.shape
    q = torch.empty(rows, cols, device=x.device, dtype=FP8_DTYPE)
    scale = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
    if rows:
        pdl = pdl_available(x)
        _quantize_rows_kernel[(rows,)](
            x,
            q,
            scale,
            cols,
            x.stride(0),
            q.stride(0),
            FP8_MAX_C=FP8_MAX,
            INV_FP8_MAX_C=INV_FP8_MAX,
            MIN_SCALE_C=MIN_SCALE,
            BLOCK=triton.next_power_of_2(cols),
            PDL=pdl,
            launch_pdl=pdl,
            num_warps=4 if cols <= 4096 else 8,
        )
    return q, scale
