"""Route checkpoint tensors to parameters: stacked projections, per-parameter loaders, completeness check."""

from __future__ import annotations

from typing import Iterable, List, Sequence, Set, Tuple, Union

import torch
from torch import nn

StackedMapping = Sequence[Tuple[str, str, Union[str, int]]]


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(
            f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit parameter {tuple(param.shape)}"
        )
    param.data.copy_(loaded)


def load_stacked_weights(
    model: nn.Module,
    weights: Iterable[Tuple[str, torch.Tensor]],
    stacked_params_mapping: StackedMapping,
    skip_suffixes: Tuple[str, ...] = (),
    extra_loader=None,
    ignore_param=None,
) -> Set[str]:
    """Load every tensor; raise if a checkpoint tensor has no parameter or a parameter got nothing.

    `extra_loader(name, tensor, params) -> claimed name or None` may claim tensors first (e.g. MoE
    experts); `ignore_param(name)` exempts parameters filled that way from the completeness check.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: Set[str] = set()
    unexpected: List[str] = []
    for name, tensor in weights:
        if name.endswith(skip_suffixes):
            continue
        if extra_loader is not None:
            claimed = extra_loader(name, tensor, params)
            if claimed:
                loaded.add(claimed)
                continue
        for param_suffix, ckpt_suffix, shard_id in stacked_params_mapping:
            if ckpt_suffix in name:
                target = name.replace(ckpt_suffix, param_suffix)
                if target in params:
                    params[target].weight_loader(params[target], tensor, shard_id)
                    loaded.add(target)
                    break
        else:
            if name not in params:
                unexpected.append(name)
                continue
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
    if unexpected:
        raise ValueError(f"checkpoint tensors with no matching parameter: {unexpected[:8]}")
    tied = {n for n, p in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = sorted(n for n in set(params) - loaded - tied if ignore_param is None or not ignore_param(n))
    if missing:
        raise ValueError(f"parameters missing from the checkpoint: {missing[:8]}")
    return loaded
