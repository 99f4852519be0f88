"""FP8 (e4m3) expert weights: one fp32 scale per 128x128 block (DeepSeek-V3/Qwen3-FP8's layout, ``FP8``) or per
output row (compressed-tensors' per-channel layout, as llm-compressor writes it: KTransformers' ``FP8_PERCHANNEL``)."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.moe.weight_format import WeightQuant
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, ParamLayout
from sglang.srt.layers.quantization.utils import cdiv, pad_to_multiple

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
FP8_BLOCK = 128  # the edge of DeepSeek-style block scales (weights 128x128, activations 1x128)
INV_FP8_MAX = 1.0 / FP8_MAX
# The smallest scale: an all-zero row quantizes to zeros with it instead of dividing by zero.
MIN_SCALE = 1e-12


class Fp8FusedMoEMethod(FusedMoEMethodBase):
    """Params: w13_weight [E, 2I, H] float8_e4m3fn, w13_weight_scale_inv [E, 2I/128, ceil(H/128)] fp32,
    w2_weight [E, H, I] float8_e4m3fn, w2_weight_scale_inv [E, ceil(H/128), ceil(I/128)] fp32.

    The "scale_inv" name is the checkpoints' (weight = fp8 * scale_inv). Weight-only: activations are
    never quantized, the kernel decodes fp8 tiles to the activation dtype.
    """

    name = "FP8"
    scale_suffix = "_weight_scale_inv"

    def __init__(self, block_size: int = 128) -> None:
        self.block = block_size
        self.scale_row_block = block_size

    def check_sizes(self, hidden_size: int, intermediate_size: int) -> None:
        # w1 and w3 are loaded separately, so no scale block may straddle the w1/w3 boundary.
        if intermediate_size % self.block:
            raise ValueError(
                f"FP8 block quantization needs intermediate_size ({intermediate_size}) to be a multiple "
                f"of the block size {self.block} (per tensor-parallel partition)"
            )

    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        return ParamLayout((rows, cols), FP8_DTYPE)

    def scale_format(self, rows: int, cols: int) -> Optional[ParamLayout]:
        return ParamLayout((cdiv(rows, self.block), cdiv(cols, self.block)), torch.float32)

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        rows, cols = weight.shape
        b = self.block
        padded = pad_to_multiple(pad_to_multiple(weight.float(), 0, b), 1, b)
        blocks = padded.view(padded.shape[0] // b, b, padded.shape[1] // b, b)
        scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero block: any scale works
        q = (blocks / safe[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
        q = q.view(padded.shape)[:rows, :cols].to(FP8_DTYPE)
        return q, scale

    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        assert scale is not None
        b = self.block
        full = scale.repeat_interleave(b, dim=0)[:rows].repeat_interleave(b, dim=1)[:, :cols]
        return (qweight.float() * full).to(dtype)

    def holds_checkpoint_fp8(self, strategy: str) -> bool:
        return strategy == "block"

    def load_expert_checkpoint_fp8(
        self, layer: torch.nn.Module, expert_id: int, shard: str, tensor: torch.Tensor, is_scale: bool
    ) -> None:
        """The checkpoint's e4m3 rows (already this rank's slice) or its [rows/128, cols/128] scale_inv, copied."""
        self.copy_checkpoint_matrix(layer, expert_id, shard, tensor, is_scale, FP8_DTYPE)

    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        return WeightQuant.FP8_BLOCK, self.block, self.block


class Fp8PerChannelFusedMoEMethod(FusedMoEMethodBase):
    """Params: w13_weight [E, 2I, H] float8_e4m3fn, w13_weight_scale [E, 2I] fp32, w2_weight [E, H, I]
    float8_e4m3fn, w2_weight_scale [E, H] fp32: weight = fp8 x scale[row]. A per-channel checkpoint's experts
    (compressed-tensors ``weight_scale`` [rows, 1]) are held as they are; a per-tensor one's single scale is
    each row's (the same values). Weight-only, as FP8: the kernels decode the codes to the activation dtype
    and apply the row's scale once after the K loop."""

    name = "FP8_PERCHANNEL"

    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        return ParamLayout((rows, cols), FP8_DTYPE)

    def scale_format(self, rows: int, cols: int) -> Optional[ParamLayout]:
        return ParamLayout((rows,), torch.float32)

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        scale = weight.abs().amax(dim=1) / FP8_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale works
        return (weight / safe[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale

    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        assert scale is not None
        return (qweight.float() * scale[:, None]).to(dtype)

    def holds_checkpoint_fp8(self, strategy: str) -> bool:
        return strategy in ("channel", "tensor")

    def load_expert_checkpoint_fp8(
        self, layer: torch.nn.Module, expert_id: int, shard: str, tensor: torch.Tensor, is_scale: bool
    ) -> None:
        """The checkpoint's e4m3 rows (this rank's slice), or their scales: one per row (this rank's rows), or
        one for the whole tensor, which every row takes."""
        if is_scale:
            tensor = tensor.reshape(-1)
            if tensor.numel() == 1:
                _, rows = self._shard_target(layer.moe_weight_spec, shard)
                tensor = tensor.expand(rows.stop - rows.start)
        self.copy_checkpoint_matrix(layer, expert_id, shard, tensor, is_scale, FP8_DTYPE)

    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        return WeightQuant.FP8_CHANNEL, 1, 0  # group_k unused: the scale is applied after the K loop
