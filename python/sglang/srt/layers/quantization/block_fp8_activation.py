"""An activation quantized per token and 128-column group, as it passes from the kernel that produced it to the
block-fp8 projection that reads it (``fp8_block_linear.py``): plain data and its buffers, nothing else (the kernels
that write one import this, and the projections that read one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from sglang.srt.layers.quantization.fp8 import FP8_BLOCK, FP8_DTYPE


@dataclass(frozen=True)
class ActivationLayout:
    """How a block-fp8 GEMM branch takes its quantized activation: rows padded to a multiple of ``pad_rows_to``
    with zero rows, scales [rows, K/128] row-major or column-major (cuBLAS's block-scaled GEMM takes the latter)."""

    pad_rows_to: int = 1
    column_major_scales: bool = False


ROW_MAJOR = ActivationLayout()


@dataclass(frozen=True)
class BlockFp8Activation:
    """An activation quantized per token and 128-column group, in the layout of the projection that reads it: what
    a kernel before a block-fp8 projection hands it instead of its bf16 output (``LinearBase.input_quantization``
    says which layout, or that the projection takes the bf16 tensor)."""

    q: torch.Tensor  # float8_e4m3fn [rows padded, K]
    scale: torch.Tensor  # fp32 [rows padded, ceil(K/128)], in the layout's order
    rows: int  # the real rows (tokens)
    dtype: torch.dtype  # the activation's own dtype: the projection's output dtype
    layout: ActivationLayout


# An activation as it passes from one layer to the next: a tensor, or quantized for the block-fp8 projection it feeds.
Activation = Union[torch.Tensor, BlockFp8Activation]


def padded_rows(rows: int, layout: ActivationLayout) -> int:
    return -(-rows // layout.pad_rows_to) * layout.pad_rows_to


def empty_block_fp8_activation(
    rows: int, k: int, dtype: torch.dtype, layout: ActivationLayout, device: torch.device
) -> BlockFp8Activation:
    """The buffers a quantizing kernel writes: q [rows padded, k] and scales in the layout's order."""
    total, groups = padded_rows(rows, layout), -(-k // FP8_BLOCK)
    q = torch.empty(total, k, device=device, dtype=FP8_DTYPE)
    strides = (1, total) if layout.column_major_scales else (groups, 1)
    scale = torch.empty_strided((total, groups), strides, device=device, dtype=torch.float32)
    return BlockFp8Activation(q, scale, rows, dtype, layout)
