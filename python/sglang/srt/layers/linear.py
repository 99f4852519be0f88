"""Linear layers sharded for tensor parallelism, with weight loaders that take full checkpoint tensors.

Column-parallel layers split the output dimension (no communication); row-parallel layers split the
input dimension and all-reduce their partial sums. Merged layers (gate+up, q+k+v) hold several
checkpoint tensors in one parameter so one GEMM serves them; their loaders place each shard.
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)


def divide(a: int, b: int) -> int:
    if a % b:
        raise ValueError(f"{a} is not divisible by the tensor-parallel size {b}")
    return a // b


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool, params_dtype: Optional[torch.dtype]) -> None:
        super().__init__()
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=self.params_dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=self.params_dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy_checked(param.data, loaded)


def _copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor of shape {tuple(src.shape)} does not fit parameter {tuple(dst.shape)}")
    dst.copy_(src)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, params_dtype=None, prefix: str = "") -> None:
        super().__init__(input_size, output_size, bias, params_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


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
    ) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self.gather_output = gather_output
        super().__init__(input_size, self.output_size_per_partition, bias, params_dtype)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = param.shape[0]
        _copy_checked(param.data, loaded.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs (e.g. gate_proj and up_proj) stored back to back."""

    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False, params_dtype=None, prefix: str = "") -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, params_dtype=params_dtype, prefix=prefix)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[int] = None) -> None:
        if shard_id is None:
            raise ValueError("MergedColumnParallelLinear needs a shard id")
        shard_size = divide(self.output_sizes[shard_id], self.tp_size)
        offset = sum(divide(s, self.tp_size) for s in self.output_sizes[:shard_id])
        src = loaded.narrow(0, self.tp_rank * shard_size, shard_size)
        _copy_checked(param.data.narrow(0, offset, shard_size), src)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one parameter; KV heads are replicated when there are fewer than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        params_dtype=None,
        prefix: str = "",
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, total_num_kv_heads)
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size)
            self.num_kv_head_replicas = 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, output_size, bias, params_dtype=params_dtype, prefix=prefix)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Union[str, None] = None) -> None:
        if shard_id == "q":
            offset, size, rank = 0, self.q_size, self.tp_rank
        elif shard_id in ("k", "v"):
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, rank = self.kv_size, self.tp_rank // self.num_kv_head_replicas
        else:
            raise ValueError(f"QKVParallelLinear shard id must be q, k or v, got {shard_id!r}")
        _copy_checked(param.data.narrow(0, offset, size), loaded.narrow(0, rank * size, size))


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
    ) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self.reduce_results = reduce_results
        super().__init__(self.input_size_per_partition, output_size, bias, params_dtype)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param.dim() == 1:  # bias: applied once, after the reduction
            _copy_checked(param.data, loaded)
            return
        size = param.shape[1]
        _copy_checked(param.data, loaded.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.reduce_results:
            y = tensor_model_parallel_all_reduce(y)
        if self.bias is not None:
            y = y + self.bias
        return y
