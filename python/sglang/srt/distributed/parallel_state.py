"""Tensor-parallel process group: rank, world size and collectives over torch.distributed.

With tp_size == 1 nothing is initialised and every collective is the identity, so single-device code
never touches torch.distributed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass
class GroupCoordinator:
    rank_in_group: int = 0
    world_size: int = 1
    device_group: Optional[dist.ProcessGroup] = None  # NCCL on CUDA, gloo on CPU
    cpu_group: Optional[dist.ProcessGroup] = None  # always gloo: small host-side reductions

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def all_gather_floats(self, value: float) -> List[float]:
        if self.world_size == 1:
            return [float(value)]
        t = torch.tensor([value], dtype=torch.float64)
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t, group=self.cpu_group)
        return [float(p.item()) for p in parts]


_TP = GroupCoordinator()


def get_tp_group() -> GroupCoordinator:
    return _TP


def get_tensor_model_parallel_rank() -> int:
    return _TP.rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return _TP.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return _TP.all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _TP.all_gather(x, dim)


def init_distributed_environment(
    backend: str, world_size: int, rank: int, init_method: str, local_rank: int, timeout_s: float = 600.0
) -> None:
    """Join the default process group (skipped for a single rank)."""
    if world_size == 1 or dist.is_initialized():
        return
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=timedelta(seconds=timeout_s),
    )
    logger.info("Joined process group: rank %d/%d (%s, local rank %d)", rank, world_size, backend, local_rank)


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    global _TP
    if tensor_model_parallel_size == 1:
        _TP = GroupCoordinator()
        return
    world = dist.get_world_size()
    if world != tensor_model_parallel_size:
        raise ValueError(f"world size {world} != --tp-size {tensor_model_parallel_size} (only TP is supported)")
    ranks = list(range(world))
    device_group = dist.group.WORLD
    cpu_group = dist.new_group(ranks, backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    _TP = GroupCoordinator(dist.get_rank(), world, device_group, cpu_group)


def destroy_model_parallel() -> None:
    global _TP
    _TP = GroupCoordinator()
    if dist.is_initialized():
        dist.destroy_process_group()
