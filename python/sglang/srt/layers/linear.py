"""Linear layers sharded for tensor parallelism, with weight loaders that take full checkpoint tensors.

Column-parallel layers split the output dimension (no communication); row-parallel layers split the
input dimension and all-reduce their partial sums. Merged layers (gate+up, q+k+v) hold several
checkpoint tensors in one parameter so one GEMM serves them; their loaders place each shard.

With ``quantization="fp8"`` a layer stores its weight in float8_e4m3fn with one fp32 scale per output
row (a buffer, ``weight_scale``): every loader hands whole rows to ``_load_rows``, which quantizes them as
they arrive, so the full-precision weight never exists on the device (``quantization/fp8_linear.py``).
A native FP8 checkpoint's layers keep its own fp8 weights and scales, never re-quantized: ``"fp8_channel"``
(compressed-tensors: ``weight_scale`` [N, 1], a parameter; the same GEMM as ``"fp8"``) and ``"fp8_block"``
(``weight_scale_inv`` per 128x128 block, ``quantization/fp8_block_linear.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from sglang.srt.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from sglang.srt.distributed.partition import HeadPartition, shard_range
from sglang.srt.layers.activation import silu_and_mul
from sglang.srt.layers.decode_gemm import (
    CUBLAS_ONLY,
    GemmPlan,
    linear,
    linear_add_rmsnorm,
    linear_silu_and_mul,
    plan_for_shape,
)
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.quantization.block_fp8_activation import ROW_MAJOR, Activation, ActivationLayout
from sglang.srt.layers.quantization.fp8_block_linear import GROUP as FP8_BLOCK
from sglang.srt.layers.quantization.fp8_block_linear import fp8_block_linear, fp8_block_linear_add_rmsnorm
from sglang.srt.layers.quantization.fp8_linear import FP8_DTYPE, fp8_linear, fp8_linear_silu_and_mul, quantize_rows
from sglang.srt.server_args_cli import QUANTIZATIONS

# Weight formats of a linear layer: --quantization's (online) and a native FP8 checkpoint's own.
CHECKPOINT_FP8_FORMATS = ("fp8_channel", "fp8_block")
LINEAR_FORMATS = (*QUANTIZATIONS, *CHECKPOINT_FP8_FORMATS)


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool,
        params_dtype: Optional[torch.dtype],
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__()
        if quantization not in (None, *LINEAR_FORMATS):
            raise ValueError(f"linear layers support quantization {LINEAR_FORMATS} or none, got {quantization!r}")
        self.quantization = quantization
        self.params_dtype = params_dtype or torch.get_default_dtype()  # activations and bias
        weight_dtype = FP8_DTYPE if quantization is not None else self.params_dtype
        self.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=weight_dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if quantization == "fp8_channel":  # the checkpoint's per-row scales: a parameter it fills
            self.weight_scale = nn.Parameter(torch.ones(output_size, 1, dtype=torch.float32), requires_grad=False)
            self.weight_scale.weight_loader = self.weight_loader
        else:
            # Online fp8: derived at load time, never read from a checkpoint: a buffer, not a parameter.
            self.register_buffer(
                "weight_scale",
                torch.ones(output_size, 1, dtype=torch.float32) if quantization == "fp8" else None,
                persistent=False,
            )
        if quantization == "fp8_block":
            blocks = (-(-output_size // FP8_BLOCK), -(-input_size // FP8_BLOCK))
            self.weight_scale_inv = nn.Parameter(torch.ones(blocks, dtype=torch.float32), requires_grad=False)
            self.weight_scale_inv.weight_loader = self.weight_loader
        else:
            self.register_parameter("weight_scale_inv", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=self.params_dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        # Which GEMM serves each batch size; cuBLAS until `attach_gemm_plans` finds a tuned entry.
        self.gemm_plan: GemmPlan = CUBLAS_ONLY

    @property
    def is_fp8(self) -> bool:
        """fp8 weights with one scale per output row (online or the checkpoint's): ``fp8_linear``."""
        return self.weight_scale is not None

    @property
    def is_block_fp8(self) -> bool:
        """A block-fp8 checkpoint's weights and 128x128 scales: ``fp8_block_linear``."""
        return self.weight_scale_inv is not None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        self._load_slice(param, 0, loaded, 0, self.weight.shape[0])

    def _load_slice(
        self, param: nn.Parameter, dst_row: int, loaded: torch.Tensor, src_start: int, size: int, dim: int = 0
    ) -> None:
        """``size`` rows (dim 0) or columns (dim 1, row-parallel) of a checkpoint tensor from ``src_start`` into
        ``param`` at row ``dst_row``, where ``loaded`` is the weight, the bias, or a checkpoint scale of it: a
        block scale is cut in 128-row/column blocks (shards must fall on block boundaries), a per-channel scale
        (or a per-tensor one, repeated over the rows) by its rows."""
        if param is self.weight_scale_inv:
            b = FP8_BLOCK
            blocks = -(-size // b)
            whole_tail = size % b == 0 or src_start // b + blocks == loaded.shape[dim]
            if dst_row % b or src_start % b or not whole_tail:
                raise ValueError(
                    f"block-fp8 layer {tuple(self.weight.shape)}: a shard of {size} rows/columns at {src_start} "
                    f"(to row {dst_row}) does not fall on the checkpoint's {b}x{b} scale blocks"
                )
            src = loaded.narrow(dim, src_start // b, blocks)
            _copy_checked(param.data.narrow(0, dst_row // b, src.shape[0]) if dim == 0 else param.data, src)
            return
        if self.quantization == "fp8_channel" and param is self.weight_scale:
            scale = loaded.float().reshape(-1, 1)
            rows = param.shape[0] if dim == 1 else size  # a row-parallel layer keeps every output row
            if scale.shape[0] == 1:  # per tensor
                scale = scale.expand(rows, 1)
            elif dim == 0:
                scale = scale.narrow(0, src_start, size)
            _copy_checked(param.data.narrow(0, dst_row, rows), scale)
            return
        self._load_rows(param, dst_row, loaded.narrow(dim, src_start, size))

    def _load_rows(self, param: nn.Parameter, start: int, rows: torch.Tensor) -> None:
        """Rows ``start ..`` of ``param`` (weight or bias) from a checkpoint slice, quantized for an fp8 weight."""
        dst = param.data.narrow(0, start, min(rows.shape[0], param.shape[0] - start))
        if param is self.weight and self.quantization in CHECKPOINT_FP8_FORMATS:
            if rows.dtype != FP8_DTYPE:  # e.g. a module the quantization_config leaves unquantized
                raise ValueError(
                    f"a {self.quantization} layer takes the checkpoint's float8_e4m3fn weight, got {rows.dtype}"
                )
            _copy_checked(dst, rows.to(dst.device))
            return
        if param is not self.weight or not self.is_fp8:
            _copy_checked(dst, rows)
            return
        if dst.shape != rows.shape:
            raise ValueError(f"checkpoint tensor of shape {tuple(rows.shape)} does not fit rows {tuple(dst.shape)}")
        qweight, scale = quantize_rows(rows.to(dst.device))
        dst.copy_(qweight)
        self.weight_scale.narrow(0, start, rows.shape[0]).copy_(scale)

    def input_quantization(self, x: torch.Tensor) -> Optional[ActivationLayout]:
        """Where a kernel before this layer may hand it ``x`` (2-D) already quantized (a block-fp8 layer): the
        layout its GEMM branch for x's rows takes (on the GPU ``fp8_block_kernels.input_layout``; the CPU's torch
        product takes any); None: x as it is."""
        if not (self.is_block_fp8 and x.dim() == 2):
            return None
        if not x.is_cuda:
            return ROW_MAJOR
        from sglang.srt.layers.quantization.fp8_block_kernels import input_layout

        return input_layout(self.weight, self.gemm_plan, x.shape[0], x.dtype)

    def matmul(self, x: Activation, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x @ weight^T (+ bias) through the GEMM this layer's plan picks for x's row count (x handed over
        quantized only to a block-fp8 layer, in the layout ``input_quantization`` gave)."""
        if self.is_block_fp8:
            return fp8_block_linear(x, self.weight, self.weight_scale_inv, bias, self.gemm_plan)
        if self.is_fp8:
            return fp8_linear(x, self.weight, self.weight_scale, bias, self.gemm_plan)
        return linear(x, self.weight, bias, self.gemm_plan)


def _copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor of shape {tuple(src.shape)} does not fit parameter {tuple(dst.shape)}")
    dst.copy_(src)


def _check_fused_rows(layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor, rows: int) -> None:
    """A fused checkpoint weight or bias must hold every part whole: a short one would load a prefix silently."""
    if (param is layer.weight or param is layer.bias) and loaded.shape[0] != rows:
        raise ValueError(f"a fused checkpoint tensor of {loaded.shape[0]} rows for a layer of {rows} (all parts)")


class ReplicatedLinear(LinearBase):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        params_dtype=None,
        prefix: str = "",
        quantization: Optional[str] = None,
    ) -> None:
        super().__init__(input_size, output_size, bias, params_dtype, quantization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


def stacked_layout(part_sizes: Sequence[int], block_fp8: bool) -> tuple[list[int], int]:
    """A StackedLinear's parts' first rows and its weight's rows: back to back; for a block-fp8 weight each part
    starts on a 128-row scale block (a block never straddles two checkpoint tensors) and the rows are whole blocks
    (the engine sends only whole blocks of N to cuBLAS's block-scaled GEMM, ``fp8_block_kernels.
    takes_cublas_block_gemm``; DeepSeek-V3's q_a + kv_a: 1,536 + 576 rows -> 2,176)."""
    align = FP8_BLOCK if block_fp8 else 1
    starts, rows = [], 0
    for size in part_sizes:
        starts.append(rows)
        rows = -(-(rows + size) // align) * align
    return starts, rows


class StackedLinear(LinearBase):
    """Several checkpoint projections of the same input, each with its own rows on this rank (a head-split
    part beside a replicated one), stored back to back so that one GEMM serves them: MLA's query projection and
    kv_a_proj_with_mqa (models/deepseek_v2.py). ``parts``: shard id -> (the checkpoint tensor's rows, this
    rank's first row in it, how many); a checkpoint tensor fills its part, and must have exactly its rows.
    A block-fp8 weight has zero padding rows where a part does not end on a scale block (``stacked_layout``), never
    loaded and never returned: ``forward`` gives each part's columns."""

    def __init__(
        self,
        input_size: int,
        parts: Mapping[str, tuple[int, int, int]],
        params_dtype=None,
        quantization: Optional[str] = None,
    ) -> None:
        self.parts = dict(parts)
        starts, rows = stacked_layout(self.part_sizes, quantization == "fp8_block")
        self.part_starts = dict(zip(self.parts, starts))
        super().__init__(input_size, rows, False, params_dtype, quantization)
        with torch.no_grad():  # padding rows: finite products, whatever the GEMM does with them
            for start, size, end in zip(starts, self.part_sizes, [*starts[1:], rows]):
                self.weight[start + size : end].zero_()

    @property
    def part_sizes(self) -> list[int]:
        """Each part's output columns, in order (what ``forward``'s result splits into)."""
        return [size for _, _, size in self.parts.values()]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[str] = None) -> None:
        if shard_id not in self.parts:
            raise ValueError(f"{type(self).__name__} parts are {list(self.parts)}, got shard id {shard_id!r}")
        rows, src_start, size = self.parts[shard_id]
        if param is self.weight and loaded.shape[0] != rows:  # a short tensor would load a prefix silently
            raise ValueError(f"checkpoint tensor for part {shard_id!r} has {loaded.shape[0]} rows, expected {rows}")
        self._load_slice(param, self.part_starts[shard_id], loaded, src_start, size)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each part's output [T, its rows], in order: views of the one GEMM's rows."""
        y = self.matmul(x, None)
        return [y[..., start : start + size] for start, size in zip(self.part_starts.values(), self.part_sizes)]


class ColumnParallelLinear(LinearBase):
    """Y = X A with A split along its output dimension; each rank computes its slice of Y."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        gather_output: bool = False,
        params_dtype=None,
        prefix: str = "",
        quantization: Optional[str] = None,
    ) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.output_start, end = self._output_range(output_size)
        self.output_size_per_partition = end - self.output_start
        if gather_output and output_size % self.tp_size:
            raise ValueError(f"gathering needs equal shards; {output_size} does not divide by {self.tp_size}")
        self.gather_output = gather_output
        super().__init__(input_size, self.output_size_per_partition, bias, params_dtype, quantization)

    def _output_range(self, output_size: int) -> tuple[int, int]:
        return shard_range(output_size, self.tp_size, self.tp_rank)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        self._load_slice(param, 0, loaded, self.output_start, self.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.bias)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs (e.g. gate_proj and up_proj) stored back to back."""

    def __init__(
        self,
        input_size: int,
        output_sizes: List[int],
        bias: bool = False,
        params_dtype=None,
        prefix: str = "",
        quantization: Optional[str] = None,
    ) -> None:
        self.output_sizes = output_sizes
        super().__init__(
            input_size, sum(output_sizes), bias, params_dtype=params_dtype, prefix=prefix, quantization=quantization
        )
        # The ``N x K:silu`` plan: the projection and SiLU-and-mul in one kernel (`silu_and_mul`).
        self.silu_plan: GemmPlan = CUBLAS_ONLY

    @property
    def is_gated_pair(self) -> bool:
        """Two equal outputs (gate, up): what ``silu_and_mul`` takes."""
        return len(self.output_sizes) == 2 and self.output_sizes[0] == self.output_sizes[1]

    def silu_and_mul(self, x: Activation, into: Optional[LinearBase] = None) -> Activation:
        """``silu(gate) * up`` of this projection's two outputs: one kernel where the silu plan has a config
        for x's rows (the activation in the GEMM's epilogue), else the projection then the activation kernel.
        ``into``: the projection that reads the result (down_proj); where it takes it quantized
        (``input_quantization``), the activation kernel hands it over so."""
        if not self.is_gated_pair:
            raise ValueError(f"silu_and_mul needs two equal outputs, got {self.output_sizes}")
        if self.is_block_fp8:  # no fused epilogue for block scales: the GEMM, then the activation kernel
            y = self(x)
            return silu_and_mul(y, into.input_quantization(y) if into is not None else None)
        if self.is_fp8:
            fused = fp8_linear_silu_and_mul(x, self.weight, self.weight_scale, self.bias, self.silu_plan)
        else:
            fused = linear_silu_and_mul(x, self.weight, self.bias, self.silu_plan)
        return fused if fused is not None else silu_and_mul(self(x))

    def _output_range(self, output_size: int) -> tuple[int, int]:
        # Each merged output is split on its own; this rank's parameter holds its slices back to back.
        return 0, sum(self._shard(size)[1] - self._shard(size)[0] for size in self.output_sizes)

    def _shard(self, size: int) -> tuple[int, int]:
        return shard_range(size, self.tp_size, self.tp_rank)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[int] = None) -> None:
        """``shard_id``: which output the checkpoint tensor is; None: the checkpoint holds them fused, back to
        back (Phi-3's gate_up_proj), and each is cut out of it as its own tensor would be."""
        if shard_id is None:
            _check_fused_rows(self, param, loaded, sum(self.output_sizes))
            for i in range(len(self.output_sizes)):
                self._load_output(param, loaded, i, fused_start=sum(self.output_sizes[:i]))
            return
        self._load_output(param, loaded, shard_id, fused_start=0)

    def _load_output(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int, fused_start: int) -> None:
        start, end = self._shard(self.output_sizes[shard_id])
        offset = sum(self._shard(s)[1] - self._shard(s)[0] for s in self.output_sizes[:shard_id])
        self._load_slice(param, offset, loaded, fused_start + start, end - start)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one parameter, split by attention head (see distributed/partition.py)."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        params_dtype=None,
        prefix: str = "",
        quantization: Optional[str] = None,
    ) -> None:
        self.head_size = head_size
        self.heads = HeadPartition.for_rank(
            total_num_heads,
            total_num_kv_heads,
            get_tensor_model_parallel_world_size(),
            get_tensor_model_parallel_rank(),
        )
        self.num_heads, self.num_kv_heads = self.heads.num_q_heads, self.heads.num_kv_heads
        # Where k and v start in a checkpoint's fused [q; k; v] tensor (all heads).
        self.fused_starts = {
            "q": 0,
            "k": total_num_heads * head_size,
            "v": (total_num_heads + total_num_kv_heads) * head_size,
        }
        output_size = (total_num_heads + 2 * total_num_kv_heads) * head_size  # the checkpoint's
        self.fused_rows = output_size
        super().__init__(
            hidden_size, output_size, bias, params_dtype=params_dtype, prefix=prefix, quantization=quantization
        )

    def _output_range(self, output_size: int) -> tuple[int, int]:
        return 0, (self.num_heads + 2 * self.num_kv_heads) * self.head_size

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Union[str, None] = None) -> None:
        """``shard_id`` "q", "k" or "v": the checkpoint's own projection; None: its fused [q; k; v] tensor over
        all heads (Phi-3's qkv_proj), each part cut out of it as its own tensor would be."""
        if shard_id is None:
            _check_fused_rows(self, param, loaded, self.fused_rows)
            for part, fused_start in self.fused_starts.items():
                self._load_part(param, loaded, part, fused_start)
            return
        self._load_part(param, loaded, shard_id, 0)

    def _load_part(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str, fused_start: int) -> None:
        d = self.head_size
        if shard_id == "q":
            offset, src_start, size = 0, self.heads.q_start * d, self.q_size
        elif shard_id in ("k", "v"):
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            src_start, size = self.heads.kv_start * d, self.kv_size
        else:
            raise ValueError(f"QKVParallelLinear shard id must be q, k or v, got {shard_id!r}")
        self._load_slice(param, offset, loaded, fused_start + src_start, size)


class RowParallelLinear(LinearBase):
    """Y = X A with A split along its input dimension; partial products are all-reduced."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        reduce_results: bool = True,
        params_dtype=None,
        prefix: str = "",
        input_range: Optional[tuple[int, int]] = None,
        quantization: Optional[str] = None,
    ) -> None:
        """`input_range` overrides the even split (o_proj takes its rank's query heads)."""
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_start, end = input_range or shard_range(input_size, self.tp_size, self.tp_rank)
        self.input_size_per_partition = end - self.input_start
        self.reduce_results = reduce_results
        super().__init__(self.input_size_per_partition, output_size, bias, params_dtype, quantization)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param is self.bias:  # applied once, after the reduction
            _copy_checked(param.data, loaded)
            return
        if self.quantization == "fp8_channel" and param is self.weight_scale:  # per output row: not split
            self._load_slice(param, 0, loaded, 0, self.weight.shape[0])
            return
        self._load_slice(param, 0, loaded, self.input_start, self.input_size_per_partition, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, None)
        if self.reduce_results:
            y = tensor_model_parallel_all_reduce(y)
        if self.bias is not None:
            y = y + self.bias
        return y

    def forward_add_norm(
        self, x: Activation, residual: torch.Tensor, norm: NormInto, addend: Optional[torch.Tensor] = None
    ) -> Tuple[Activation, torch.Tensor]:
        """``norm(self(x) [+ addend], residual)``: (the norm of that + residual, the sum; on the GPU written over
        ``residual``, as the norm kernel does), what the decoder does after o_proj and down (``addend``: another
        output of the same shape, DeepSeek's routed experts beside its shared experts). Where this layer's plan
        splits K for x's rows (one rank, no bias, bf16 or block-fp8 weights), the adds and the norm run in the
        GEMM's split-K sum kernel instead of kernels of their own, with the same bits (and that kernel quantizes
        the norm for a block-fp8 projection after it, as ``norm`` would)."""
        if self.tp_size == 1 and self.bias is None and (self.quantization is None or self.is_block_fp8):
            eps, plan, weight = norm.norm.variance_epsilon, self.gemm_plan, norm.norm.weight
            if self.is_block_fp8:
                scale = self.weight_scale_inv
                quantize = norm.quantization(residual)
                normed = fp8_block_linear_add_rmsnorm(
                    x, self.weight, scale, plan, residual, weight, eps, addend, quantize
                )
            else:
                normed = linear_add_rmsnorm(x, self.weight, plan, residual, weight, eps, addend)
            if normed is not None:
                return normed, residual
        y = self(x)
        return norm(y if addend is None else y + addend, residual)


@dataclass(frozen=True)
class NormInto:
    """An RMSNorm and the projection that alone reads its output (None: other layers read it too, or none is
    linear). Called as the norm is; where that projection takes its input quantized (a block-fp8 layer on the GPU,
    ``LinearBase.input_quantization``), the norm's kernel hands the output over quantized: one launch less."""

    norm: RMSNorm
    projection: Optional[LinearBase]

    def quantization(self, x: torch.Tensor) -> Optional[ActivationLayout]:
        """The layout the projection takes ``x``'s norm in, or None (as it is)."""
        return self.projection.input_quantization(x) if self.projection is not None else None

    def __call__(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[Activation, Tuple[Activation, torch.Tensor]]:
        return self.norm(x, residual, quantize=self.quantization(x))


def store_weights_column_major(model: nn.Module) -> int:
    """Store every full-precision linear weight [N, K] column-major: the same [N, K] tensor with strides (1, N),
    so ``x @ weight^T`` reads a K-major matrix. For the CPU's GEMM (torch's MKL): at one to three rows it takes a
    faster kernel for that layout, measured on the 2-core AMD EPYC test machine with one thread (SmolLM2's 30
    layers of projections: 22.9 vs 27.9 ms at 1 row, 34.5 vs 48.2 at 2, 47.6 vs 53.8 at 4, within 2% at 16 and 64
    rows; the same bits from 4 rows up: benchmark/cpu_throughput/, --components). Weights that are not plain linear
    layers (embeddings, the lm_head, experts) keep their layout. Returns how many were stored."""
    count = 0
    for module in model.modules():
        if isinstance(module, LinearBase) and not (module.is_fp8 or module.is_block_fp8):
            module.weight.data = module.weight.data.t().contiguous().t()
            count += 1
    return count


def attach_gemm_plans(model: nn.Module, plans: Mapping[str, GemmPlan]) -> int:
    """Give every linear layer its shape's plan from a tuned table (``decode_gemm.load_device_table``), and a
    gate/up pair its SiLU-and-mul plan too; returns how many layers use the skinny kernel at some batch size."""
    attached = 0
    for module in model.modules():
        if not isinstance(module, LinearBase):
            continue
        block_fp8 = module.is_block_fp8
        module.gemm_plan = plan_for_shape(plans, *module.weight.shape, fp8=module.is_fp8, block_fp8=block_fp8)
        uses_skinny = module.gemm_plan.uses_skinny_kernel
        if isinstance(module, MergedColumnParallelLinear) and module.is_gated_pair and not block_fp8:
            module.silu_plan = plan_for_shape(plans, *module.weight.shape, fp8=module.is_fp8, silu_and_mul=True)
            uses_skinny = uses_skinny or module.silu_plan.uses_skinny_kernel
        attached += uses_skinny
    return attached
