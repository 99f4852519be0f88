"""Unquantized MoE experts: the weights are kept as-is in ``params_dtype`` (bf16 on GPU)."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.moe.weight_format import WeightQuant
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, ParamLayout


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    """Params: w13_weight [E, 2I, H] and w2_weight [E, H, I], both params_dtype; no scales."""

    name = "BF16"

    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        return ParamLayout((rows, cols), params_dtype)

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        return weight, None  # copy_ into the parameter does the dtype cast

    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        return qweight  # a view: nothing to decode, nothing to allocate

    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        return WeightQuant.NONE, 1, 1
