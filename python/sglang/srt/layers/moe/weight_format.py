"""How the fused-MoE GEMM kernel reads one stacked expert weight: the format enum and the weight record.

The kernel's own interface, apart from both the kernel (fused_moe_triton/) and the quant methods
(layers/quantization/) that produce it, so neither imports the other to name it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import torch


class WeightQuant(enum.IntEnum):
    """How the fused-MoE GEMM kernel decodes a weight tile (a constexpr in the kernel)."""

    NONE = 0  # weights already in a float dtype
    FP8_BLOCK = 1  # float8_e4m3fn, fp32 scale per [GROUP_N x GROUP_K] block
    INT8_CHANNEL = 2  # int8, fp32 scale per output row
    INT4_GROUP = 3  # unsigned nibbles holding q + 8, two per byte along K, fp32 scale per K-group
    MXFP4 = 4  # e2m1 nibbles two per byte along K, e8m0 (uint8) scale per 32 elements of K
    FP8_CHANNEL = 5  # float8_e4m3fn, fp32 scale per output row (applied after the K loop, as INT8_CHANNEL)


@dataclass(frozen=True)
class MoEGemmWeight:
    """One stacked expert weight as the triton kernel reads it: logically [E, N, K]."""

    weight: torch.Tensor  # [E, N, K], or [E, N, K // 2] bytes for the nibble formats
    scale: Optional[torch.Tensor]  # [E, ceil(N / group_n), ceil(K / group_k)] (INT8: [E, N])
    quant: WeightQuant
    group_n: int = 1
    group_k: int = 1

    @property
    def packed(self) -> bool:
        return self.quant in (WeightQuant.INT4_GROUP, WeightQuant.MXFP4)

    @property
    def n(self) -> int:
        return self.weight.shape[1]

    @property
    def k(self) -> int:
        return self.weight.shape[2] * (2 if self.packed else 1)


@dataclass(frozen=True)
class SharedMLPWeights:
    """A dense shared-experts MLP's own weights, run as `count` more slots of one token's expert GEMMs (each of the
    routed experts' width W): gate_up [2 x count x W, K] (the gate rows of the `count` experts back to back, then their
    up rows: a merged column-parallel layer's layout), down [H, count x W]. Full precision, in the experts' dtype, K
    contiguous as the experts' weights are."""

    gate_up: torch.Tensor
    down: torch.Tensor
    count: int

    @property
    def width(self) -> int:
        return self.down.shape[1] // self.count
