"""MXFP4 expert weights (OCP microscaling): e2m1 values, one power-of-two e8m0 scale per 32 inputs."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.moe.weight_format import WeightQuant
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, ParamLayout
from sglang.srt.layers.quantization.utils import (
    E2M1_MAX,
    E8M0_BIAS,
    cdiv,
    e2m1_decode_table,
    e2m1_encode,
    e8m0_to_float,
    expand_groups,
    group_last_dim,
    pack_nibbles,
    unpack_nibbles,
)

MX_BLOCK = 32  # fixed by the OCP MX spec


class Mxfp4FusedMoEMethod(FusedMoEMethodBase):
    """Params: w13_weight [E, 2I, H/2] uint8, w13_weight_scale [E, 2I, ceil(H/32)] uint8,
    w2_weight [E, H, I/2] uint8, w2_weight_scale [E, H, ceil(I/32)] uint8.

    Byte j of a row holds e2m1 codes of elements 2j (low nibble) and 2j+1 (high nibble);
    weight = e2m1(code) * 2**(scale - 127).
    """

    name = "MXFP4"

    def check_sizes(self, hidden_size: int, intermediate_size: int) -> None:
        if hidden_size % 2 or intermediate_size % 2:
            raise ValueError("MXFP4 packs two values per byte: hidden and intermediate sizes must be even")

    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        return ParamLayout((rows, cols // 2), torch.uint8)

    def scale_format(self, rows: int, cols: int) -> Optional[ParamLayout]:
        return ParamLayout((rows, cdiv(cols, MX_BLOCK)), torch.uint8)

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        rows, cols = weight.shape
        groups = group_last_dim(weight.float(), MX_BLOCK)
        amax = groups.abs().amax(dim=-1)
        # Smallest power of two with amax / 2**e <= 6, so the block max never saturates (OCP's
        # floor(log2(amax)) - 2 rule would clip values in (6, 8) * 2**e down to 6).
        mant, exp = torch.frexp(amax / E2M1_MAX)
        exp = torch.where(mant == 0.5, exp - 1, exp)  # exact powers of two need no rounding up
        exp = torch.where(amax > 0, exp, torch.full_like(exp, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)
        scale_code = (exp + E8M0_BIAS).to(torch.uint8)
        codes = e2m1_encode(groups / e8m0_to_float(scale_code).clamp_min(2.0**-126)[..., None])
        return pack_nibbles(codes.view(rows, -1)[:, :cols]), scale_code

    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        assert scale is not None
        values = e2m1_decode_table(qweight.device)[unpack_nibbles(qweight).long()]
        return (values * expand_groups(e8m0_to_float(scale), MX_BLOCK, cols)).to(dtype)

    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        return WeightQuant.MXFP4, 1, MX_BLOCK
