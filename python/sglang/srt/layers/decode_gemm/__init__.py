"""Decode-size projections through a tuned skinny GEMM where it beats cuBLAS (see ``table.py``)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.decode_gemm.table import (
    CUBLAS_ONLY,
    GemmConfig,
    GemmPlan,
    add_norm_refusal,
    load_device_table,
    parse_table,
    plan_for_shape,
)

__all__ = [
    "CUBLAS_ONLY",
    "GemmConfig",
    "GemmPlan",
    "add_norm_config",
    "linear",
    "linear_add_rmsnorm",
    "linear_silu_and_mul",
    "load_device_table",
    "parse_table",
    "plan_for_shape",
    "skinny_config",
]


def skinny_config(x: torch.Tensor, plan: GemmPlan) -> Optional[GemmConfig]:
    """The plan's skinny-kernel config for x's row count, or None (cuBLAS) when it has none or x cannot
    be read by the kernel (not 2-D with K-contiguous rows)."""
    return plan.config_for(x.shape[0]) if x.dim() == 2 and x.stride(-1) == 1 else None


def add_norm_config(
    x: torch.Tensor,
    plan: GemmPlan,
    n: int,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    addend: Optional[torch.Tensor] = None,
) -> Optional[GemmConfig]:
    """The plan's config for x's rows where the skinny GEMM's split-K sum kernel can do the adds and the norm after
    the product (``table.add_norm_refusal``), else None: what the add-norm entry points ask first."""
    config = skinny_config(x, plan)
    if config is None or add_norm_refusal(config, *x.shape, n, residual, norm_weight, addend=addend) is not None:
        return None
    return config


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: GemmPlan) -> torch.Tensor:
    """``F.linear`` unless the plan has a skinny-kernel config for this many rows."""
    config = skinny_config(x, plan)
    if config is None:
        return F.linear(x, weight, bias)
    # Imported here: triton is only installed with the GPU extras, and only a CUDA model gets a plan.
    from sglang.srt.layers.decode_gemm import kernel

    return kernel.skinny_linear(x, weight, bias, config)


def linear_add_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    plan: GemmPlan,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    addend: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """``fused_elementwise.rmsnorm(F.linear(x, weight) [+ addend], norm_weight, eps, residual=residual)`` (residual
    += the product in place; the result is the RMSNorm of that sum) with the adds and the norm in the skinny GEMM's
    split-K sum kernel, where the plan's config for x's rows splits K; None where it does not (the caller runs
    the GEMM, the add, then the norm kernel: the same bits)."""
    config = add_norm_config(x, plan, weight.shape[0], residual, norm_weight, addend)
    if config is None:
        return None
    from sglang.srt.layers.decode_gemm import kernel

    return kernel.skinny_linear(x, weight, None, config, add_norm=(residual, norm_weight, eps), addend=addend)


def linear_silu_and_mul(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], silu_plan: GemmPlan
) -> Optional[torch.Tensor]:
    """``silu(gate) * up`` of ``F.linear(x, [gate; up], bias)`` in one skinny kernel where ``silu_plan`` (the
    ``N x K:silu`` entry) has a config for this many rows; None where it has not (the caller runs the
    projection, then the activation)."""
    config = skinny_config(x, silu_plan)
    if config is None:
        return None
    from sglang.srt.layers.decode_gemm import kernel

    return kernel.skinny_linear(x, weight, bias, config, silu_and_mul=True)
