"""The contract between a fused-MoE layer and the way its expert weights are stored.

A method owns the parameter layout of one MoE layer (``create_weights``), turns full-precision
checkpoint tensors into that layout (``load_expert``), moves single experts between layers
(``copy_expert_from``, used to stream CPU-resident experts into GPU slots), and runs the experts
(``apply``). Weight-only methods subclass ``FusedMoEMethodBase`` and describe just their storage
format through the small ``*_format`` hooks; the generic code here does the per-expert plumbing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.layers import kernel_dispatch
from sglang.srt.layers.moe.weight_format import MoEGemmWeight, SharedMLPWeights, WeightQuant

if TYPE_CHECKING:
    from sglang.srt.configs.quantization_config import CheckpointQuantization

# The two stacked matrices of every expert. w13 = [w1; w3] (gate rows then up rows), both [2I, H];
# w2 is the down projection [H, I].
W13 = "w13"
W2 = "w2"
SHARDS = ("w1", "w2", "w3")


@dataclass(frozen=True)
class MoEWeightSpec:
    """What create_weights was called with; stored on the layer as ``layer.moe_weight_spec``."""

    num_experts: int
    hidden_size: int
    intermediate_size: int  # already per tensor-parallel partition
    params_dtype: torch.dtype  # the float dtype dequantized weights come back in

    def matrix_shape(self, prefix: str) -> tuple[int, int]:
        """Logical [rows, cols] of one expert's stacked matrix (rows = output features)."""
        if prefix == W13:
            return 2 * self.intermediate_size, self.hidden_size
        return self.hidden_size, self.intermediate_size


@dataclass(frozen=True)
class ParamLayout:
    shape: tuple[int, ...]
    dtype: torch.dtype


class FusedMoEMethodBase(ABC):
    """Base of all MoE weight methods. Subclasses describe one storage format."""

    name: str = ""
    # Name suffix of the scale parameter ("w13" + suffix); FP8 follows the checkpoints' "_scale_inv".
    scale_suffix: str = "_weight_scale"
    # How many logical rows share one row of the scale tensor (128 for block FP8, else 1).
    scale_row_block: int = 1

    # ---- storage format hooks (one [rows, cols] matrix of one expert) ----

    @abstractmethod
    def weight_format(self, rows: int, cols: int, params_dtype: torch.dtype) -> ParamLayout:
        """Shape/dtype of the stored weight of a logical [rows, cols] matrix."""

    def scale_format(self, rows: int, cols: int) -> Optional[ParamLayout]:
        """Shape/dtype of its scales, or None when the format has none."""
        return None

    @abstractmethod
    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Full-precision [rows, cols] -> (stored weight, scale or None) in the formats above."""

    @abstractmethod
    def dequantize(
        self, qweight: torch.Tensor, scale: Optional[torch.Tensor], rows: int, cols: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """Inverse of quantize: -> [rows, cols] in ``dtype``."""

    @abstractmethod
    def kernel_quant(self) -> tuple[WeightQuant, int, int]:
        """(kernel decode mode, group_n, group_k) for the triton GEMM."""

    def check_sizes(self, hidden_size: int, intermediate_size: int) -> None:  # noqa: B027 - optional hook
        """Raise ValueError when the format cannot store matrices of these sizes."""

    # ---- the layer-level API ----

    def param_layouts(self, spec: MoEWeightSpec) -> dict[str, ParamLayout]:
        """Every parameter create_weights registers, in order; the exact memory of a layer."""
        layouts: dict[str, ParamLayout] = {}
        for prefix in (W13, W2):
            rows, cols = spec.matrix_shape(prefix)
            w = self.weight_format(rows, cols, spec.params_dtype)
            layouts[f"{prefix}_weight"] = ParamLayout((spec.num_experts, *w.shape), w.dtype)
            s = self.scale_format(rows, cols)
            if s is not None:
                layouts[prefix + self.scale_suffix] = ParamLayout((spec.num_experts, *s.shape), s.dtype)
        return layouts

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        self.check_sizes(hidden_size, intermediate_size)
        spec = MoEWeightSpec(num_experts, hidden_size, intermediate_size, params_dtype)
        layer.moe_weight_spec = spec
        for name, lay in self.param_layouts(spec).items():
            # No device argument: an enclosing `with torch.device(...)` decides (meta for sizing).
            param = torch.nn.Parameter(torch.empty(lay.shape, dtype=lay.dtype), requires_grad=False)
            layer.register_parameter(name, param)

    def _shard_target(self, spec: MoEWeightSpec, shard: str) -> tuple[str, slice]:
        """Which stacked matrix a checkpoint shard goes to, and its rows there."""
        inter = spec.intermediate_size
        if shard == "w1":
            return W13, slice(0, inter)
        if shard == "w3":
            return W13, slice(inter, 2 * inter)
        if shard == "w2":
            return W2, slice(0, spec.hidden_size)
        raise ValueError(f"unknown expert shard {shard!r}; expected one of {SHARDS}")

    def load_expert(self, layer: torch.nn.Module, expert_id: int, shard: str, weight: torch.Tensor) -> None:
        spec: MoEWeightSpec = layer.moe_weight_spec
        prefix, rows = self._shard_target(spec, shard)
        expected = (rows.stop - rows.start, spec.matrix_shape(prefix)[1])
        if tuple(weight.shape) != expected:
            raise ValueError(f"{shard} of expert {expert_id}: expected shape {expected}, got {tuple(weight.shape)}")
        if weight.dtype == torch.float8_e4m3fn:  # codes without their scale: quantizing them would be wrong
            raise ValueError(
                f"{shard} of expert {expert_id}: a float8 checkpoint weight reached the {self.name} format's "
                "quantizer without its scale"
            )
        qweight, scale = self.quantize(weight.to(torch.float32))
        getattr(layer, f"{prefix}_weight")[expert_id, rows].copy_(qweight)
        if scale is not None:
            # Shards are aligned to scale_row_block (check_sizes), so scale rows split cleanly.
            b = self.scale_row_block
            srows = slice(rows.start // b, -(-rows.stop // b))
            getattr(layer, prefix + self.scale_suffix)[expert_id, srows].copy_(scale)

    def holds_checkpoint_fp8(self, strategy: str) -> bool:
        """Whether this format stores a native FP8 checkpoint's experts of that scale layout ("block",
        "channel", "tensor": configs/quantization_config.py) as they are: their codes and scales, copied."""
        return False

    def holds_checkpoint_int4(self, group_size: int) -> bool:
        """Whether this format stores a pack-quantized INT4 checkpoint's experts of that group size as they are."""
        return False

    def holds_checkpoint(self, quant: "CheckpointQuantization") -> bool:
        """Whether this format stores the experts of a checkpoint quantized as `quant` declares as they are."""
        if quant.is_int4:
            return quant.group_size is not None and self.holds_checkpoint_int4(quant.group_size)
        return self.holds_checkpoint_fp8(quant.strategy)

    def load_expert_checkpoint_fp8(
        self, layer: torch.nn.Module, expert_id: int, shard: str, tensor: torch.Tensor, is_scale: bool
    ) -> None:
        """One expert matrix of a native FP8 checkpoint as it is stored (e4m3 codes, or its scale), never
        re-quantized. Only a format storing that same layout can take it (FP8 blocks, FP8_PERCHANNEL rows)."""
        raise ValueError(f"the {self.name} MoE format cannot hold a native FP8 checkpoint's experts as they are")

    def copy_checkpoint_matrix(
        self,
        layer: torch.nn.Module,
        expert_id: int,
        shard: str,
        tensor: torch.Tensor,
        is_scale: bool,
        codes_dtype: torch.dtype,
    ) -> None:
        """One checkpoint expert matrix held as it is (this rank's slice): its codes (of `codes_dtype`) or its scales
        (scale_row_block rows a scale row), copied after their dtype and shape are checked."""
        prefix, rows = self._shard_target(layer.moe_weight_spec, shard)
        if is_scale:
            b = self.scale_row_block
            target = getattr(layer, prefix + self.scale_suffix)[expert_id, rows.start // b : -(-rows.stop // b)]
        else:
            target = getattr(layer, f"{prefix}_weight")[expert_id, rows]
            if tensor.dtype != codes_dtype:
                raise ValueError(f"{shard} of expert {expert_id}: expected {codes_dtype} codes, got {tensor.dtype}")
        if tuple(target.shape) != tuple(tensor.shape):
            what = "scale" if is_scale else "weight"
            raise ValueError(
                f"{shard} {what} of expert {expert_id}: expected {tuple(target.shape)}, got {tuple(tensor.shape)}"
            )
        target.copy_(tensor)

    def copy_expert_from(
        self, dst_layer: torch.nn.Module, dst_expert: int, src_layer: torch.nn.Module, src_expert: int
    ) -> None:
        for name in self.param_layouts(dst_layer.moe_weight_spec):
            src = getattr(src_layer, name)[src_expert]
            # From pinned host memory the copy can overlap compute; otherwise it must be synchronous.
            getattr(dst_layer, name)[dst_expert].copy_(src, non_blocking=src.is_pinned())

    def stored(self, layer: torch.nn.Module, prefix: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        return getattr(layer, f"{prefix}_weight"), getattr(layer, prefix + self.scale_suffix, None)

    def dequantize_expert(self, layer: torch.nn.Module, expert_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        spec: MoEWeightSpec = layer.moe_weight_spec
        out = []
        for prefix in (W13, W2):
            qweight, scale = self.stored(layer, prefix)
            rows, cols = spec.matrix_shape(prefix)
            s = None if scale is None else scale[expert_id]
            out.append(self.dequantize(qweight[expert_id], s, rows, cols, spec.params_dtype))
        return out[0], out[1]

    def gemm_weights(self, layer: torch.nn.Module) -> tuple[MoEGemmWeight, MoEGemmWeight]:
        """The layer's w13 and w2 as the triton kernel reads them (no copies)."""
        quant, group_n, group_k = self.kernel_quant()
        return tuple(  # type: ignore[return-value]
            MoEGemmWeight(*self.stored(layer, prefix), quant=quant, group_n=group_n, group_k=group_k)
            for prefix in (W13, W2)
        )

    def apply(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        backend: str = "auto",
        compute_dtype: Optional[torch.dtype] = None,
        shared: Optional[SharedMLPWeights] = None,
    ) -> torch.Tensor:
        """Run the routed experts. backend: "auto" (triton on CUDA, torch elsewhere), "triton", "native".
        compute_dtype: the native backend's GEMM dtype (fp32 by default). `shared`: one token's dense shared MLP run
        as its last slots, which only the triton kernel does (fused_experts_triton)."""
        if backend == "auto":
            backend = "triton" if kernel_dispatch.runs_moe_kernel(x) or shared is not None else "native"
        if backend == "triton":
            from sglang.srt.layers.moe.fused_moe_triton import fused_experts_triton

            w13, w2 = self.gemm_weights(layer)
            return fused_experts_triton(x, w13, w2, topk_weights, topk_ids, shared=shared)
        if backend == "native":
            from sglang.srt.layers.moe.fused_moe_native import fused_moe_native

            return fused_moe_native(
                x, topk_weights, topk_ids, lambda e: self.dequantize_expert(layer, e), compute_dtype
            )
        raise ValueError(f"unknown MoE backend {backend!r}; expected auto, triton or native")
