"""Per-token fp8 quantization of an activation in one triton kernel: the GPU's ``quantize_rows``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue
from sglang.srt.layers.quantization.fp8 import FP8_DTYPE
from sglang.srt.layers.quantization.fp8_tile import quantize_tile_rows


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n_cols,
    stride_x,
    stride_q,
    BLOCK: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    q, scale = quantize_tile_rows(tl.reshape(x, (1, BLOCK)), q_ptr.dtype.element_ty, ROUND_BY_HAND)
    tl.store(q_ptr + row * stride_q + cols, tl.reshape(q, (BLOCK,)), mask=mask)
    tl.store(scale_ptr + row + tl.arange(0, 1), scale)


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
            BLOCK=triton.next_power_of_2(cols),
            ROUND_BY_HAND=in_interpreter(x),
            PDL=pdl,
            launch_pdl=pdl,
            num_warps=4 if cols <= 4096 else 8,
        )
    return q, scale
