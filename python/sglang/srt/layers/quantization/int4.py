"""Symmetric grouped INT4 expert weights, two values per byte (the KTransformers AMXINT4 idea)."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.moe.weight_format import WeightQuant
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, ParamLayout
from sglang.srt.layers.quantization.utils import cdiv, expand_groups, group_last_dim, pack_nibbles, unpack_nibbles

INT4_MAX = 7  # scale = group absmax / 7; codes use -8..7 so rounding at the edge never clips
INT4_OFFSET = 8  # stored nibble = q + 8, so nibbles are unsigned 0..15
DEFAULT_INT4_GROUP = 128  # inputs per scale when quantizing a full-precision checkpoint (AMXINT4's)
# A pack-quantized checkpoint's expert matrix as the loader hands it to the experts (model_loader/int4_checkpoint.py):
# its code bytes in this format's layout, and its fp32 group scales.
CHECKPOINT_CODES, CHECKPOINT_GROUP_SCALES = "weight_packed", "weight_group_scale"


class Int4FusedMoEMethod(FusedMoEMethodBase):
    """Params: w13_weight [E, 2I, H/2] uint8, w13_weight_scale [E, 2I, ceil(H/G)] fp32,
    w2_weight [E, H, I/2] uint8, w2_weight_scale [E, H, ceil(I/G)] fp32, G = group_size (128).

    Byte j of a row holds elements 2j (low nibble) and 2j+1 (high nibble); weight = (nibble - 8) * scale.
    """

    name = "INT4"  # with a group size other than 128, get_moe_method's name for it is INT4_G<size>

    def __init__(self, group_size: int = DEFAULT_INT4_GROUP) -> None:
        self.group = group_size

    def check_sizes(self, hidden_size: int, intermediate_size: int) -> None:
        if hidden_size % 2 or intermediate_size % 2:
            raise ValueError("INT4 packs two values per byte: hidden and intermediate sizes must be even")

    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        return ParamLayout((rows, cols // 2), torch.uint8)

    def scale_format(self, rows: int, cols: int) -> Optional[ParamLayout]:
        return ParamLayout((rows, cdiv(cols, self.group)), torch.float32)

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        rows, cols = weight.shape
        groups = group_last_dim(weight.float(), self.group)
        scale = groups.abs().amax(dim=-1) / INT4_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(groups / safe[..., None]).clamp(-INT4_OFFSET, INT4_OFFSET - 1)
        codes = (q + INT4_OFFSET).to(torch.uint8).view(rows, -1)[:, :cols]
        return pack_nibbles(codes), scale

    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        assert scale is not None
        q = unpack_nibbles(qweight).to(torch.int32) - INT4_OFFSET
        return (q.float() * expand_groups(scale, self.group, cols)).to(dtype)

    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        return WeightQuant.INT4_GROUP, 1, self.group

    def holds_checkpoint_int4(self, group_size: int) -> bool:
        return group_size == self.group

    def load_expert_checkpoint_int4(
        self, layer: torch.nn.Module, expert_id: int, shard: str, tensor: torch.Tensor, is_scale: bool
    ) -> None:
        """A pack-quantized checkpoint's expert matrix as it is (this rank's slice): its code bytes (two codes q + 8
        a byte, the first in the low nibble: this format's own layout) or its group scales, copied."""
        self.copy_checkpoint_matrix(layer, expert_id, shard, tensor, is_scale, torch.uint8)
