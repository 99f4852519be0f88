"""INT8 expert weights, symmetric, one fp32 scale per output channel (row)."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.moe.weight_format import WeightQuant
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, ParamLayout

INT8_MAX = 127  # symmetric: -128 is never produced, so negation cannot overflow


class Int8FusedMoEMethod(FusedMoEMethodBase):
    """Params: w13_weight [E, 2I, H] int8, w13_weight_scale [E, 2I] fp32,
    w2_weight [E, H, I] int8, w2_weight_scale [E, H] fp32. weight = int8 * scale[row]."""

    name = "INT8"

    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        return ParamLayout((rows, cols), torch.int8)

    def scale_format(self, rows: int, cols: int) -> Optional[ParamLayout]:
        return ParamLayout((rows,), torch.float32)

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        scale = weight.abs().amax(dim=1) / INT8_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(weight / safe[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return q, scale

    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        assert scale is not None
        return (qweight.float() * scale[:, None]).to(dtype)

    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        return WeightQuant.INT8_CHANNEL, 1, 0  # group_k unused: the scale is applied after the K loop
