"""Weight loading shared by the MoE models (Qwen3-MoE and its relatives, DeepSeek-V2/V3): routed experts go
through the experts' own loader (FusedMoE or the KT wrapper), --kt-weight-path may supply them, and the KT
wrappers finish once every weight is in place."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from sglang.srt.layers.moe.kt_ep_wrapper import KTEPWrapperMethod, KTState
from sglang.srt.model_loader.weight_loading import load_stacked_weights

EXPERTS = ".mlp.experts."
_SHARDS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def load_routed_expert(model: nn.Module, name: str, tensor: torch.Tensor, params: dict) -> Optional[str]:
    """`load_stacked_weights`' extra loader: one checkpoint expert matrix (or an FP8 checkpoint's scale) into
    its layer's experts; None for any other tensor."""
    if EXPERTS not in name:
        return None
    prefix, rest = name.split(EXPERTS, 1)
    expert_str, proj, kind = rest.split(".", 2)  # kind: "weight", or an FP8 checkpoint's "weight_scale_inv"
    model.get_submodule(f"{prefix}.mlp.experts").weight_loader(kind, tensor, _SHARDS[proj], int(expert_str))
    return f"{prefix}{EXPERTS}{expert_str}.{proj}"


Weights = Iterable[Tuple[str, torch.Tensor]]


def with_kt_experts(weights: Weights, kt_weight_path: str, names: Callable[[Weights], Weights] = iter) -> Iterator:
    """Routed experts from --kt-weight-path (safetensors; `names` maps its tensor names to ours, as the model's
    own weights were mapped), the rest from the model."""
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    for name, tensor in weights:
        if EXPERTS not in name:
            yield name, tensor
    for name, tensor in names(safetensors_weights_iterator(kt_weight_path)):
        if EXPERTS in name:
            yield name, tensor


def load_moe_weights(
    model: nn.Module,
    weights: Weights,
    kt_state: Optional[KTState],
    stacked_params_mapping: Sequence,
    kt_names: Callable[[Weights], Weights] = iter,
    select: Callable[[Weights], Weights] = iter,
) -> Set[str]:
    """Expert parameters are filled through the experts' loader; the completeness check covers the rest.
    `kt_names`: how --kt-weight-path's tensor names map to ours (see with_kt_experts); `select`: the tensors of
    both sources the model takes (DeepSeek drops its MTP layers)."""
    if kt_state is not None and kt_state.config.weight_path:
        weights = with_kt_experts(weights, kt_state.config.weight_path, kt_names)
    weights = select(weights)
    skip = ("rotary_emb.inv_freq",)
    if getattr(model.config, "tie_word_embeddings", False):
        skip += ("lm_head.weight",)
    return load_stacked_weights(
        model,
        weights,
        stacked_params_mapping,
        skip,
        extra_loader=lambda name, tensor, params: load_routed_expert(model, name, tensor, params),
        ignore_param=lambda n: EXPERTS in n,
    )


def finish_kt_layers(model: nn.Module) -> None:
    """Pin and register the KT wrappers' CPU experts once every weight is in place."""
    for module in model.modules():
        if isinstance(module, KTEPWrapperMethod):
            module.finish_loading()
