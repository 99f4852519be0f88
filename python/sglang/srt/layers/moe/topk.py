"""Router top-k selection: the single routing contract for CPU and GPU experts.

The torch functions (``*_native``) define it and run on the CPU; on CUDA the same routing runs as one
triton kernel (topk_triton.py: one launch instead of ~5-15 in a decode step's graph)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """select_experts_native's routing: the triton kernel on CUDA, torch elsewhere."""
    if router_logits.is_cuda:
        from sglang.srt.layers.moe.topk_triton import route_topk_triton

        return route_topk_triton(router_logits, top_k, renormalize=renormalize)
    return select_experts_native(router_logits, top_k, renormalize)


def select_experts_native(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights fp32 [T, k], topk_ids int32 [T, k]).

    Softmax runs in fp32 whatever the logits dtype, so bf16 logits on the GPU and fp32 logits on
    the CPU pick the same experts with the same weights. With ``renormalize`` (Qwen3-MoE's
    norm_topk_prob) the k weights are rescaled to sum to one.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


# DeepSeek routing (transformers' DeepseekV2TopkRouter / DeepseekV3TopkRouter compute the same):
#   V2 "greedy"               softmax scores, top-k of all experts
#   V2 "group_limited_greedy" softmax scores, groups ranked by their best expert, top-k inside the best groups
#   V3 "noaux_tc"             sigmoid scores; the choice ranks scores + e_score_correction_bias, groups by the sum
#                             of their two best; the weights are the scores without the bias
# then optionally renormalised (norm_topk_prob, V3), and always times routed_scaling_factor.
GROUPED_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
GROUPED_RENORM_EPS = 1e-20  # transformers' denominator guard in norm_topk_prob


@dataclass(frozen=True)
class GroupedTopKConfig:
    top_k: int
    topk_method: str  # one of GROUPED_TOPK_METHODS
    n_group: int = 1
    topk_group: int = 1
    renormalize: bool = False
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.topk_method not in GROUPED_TOPK_METHODS:
            raise ValueError(f"topk_method must be one of {GROUPED_TOPK_METHODS}, got {self.topk_method!r}")


@dataclass(frozen=True)
class SharedExpertSlots:
    """Shared experts run in the routed experts' kernels: every token's top-k gets `count` slots more (one a shared
    expert of the routed experts' width), ids `first` .. first + count - 1 (past the routed experts: they only mark
    the slots routed; the fused MoE reads the shared MLP's own weights there, SharedMLPWeights), with weight 1 (not
    scaled by routed_scaling_factor, which is the routed experts' alone)."""

    first: int
    count: int


def _keep_best_groups(choice: torch.Tensor, group_scores: torch.Tensor, topk_group: int, fill: float) -> torch.Tensor:
    """`choice` [T, E] with every expert outside the `topk_group` best groups (by group_scores [T, G]) set to `fill`."""
    t, n_group = group_scores.shape
    best = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    keep = keep.unsqueeze(-1).expand(t, n_group, choice.shape[-1] // n_group).reshape(t, -1)
    return choice.masked_fill(~keep, fill)


def select_experts_grouped(
    router_logits: torch.Tensor,
    config: GroupedTopKConfig,
    correction_bias: Optional[torch.Tensor] = None,
    shared: Optional[SharedExpertSlots] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_experts_grouped_native's routing: the triton kernel on CUDA, torch elsewhere. `shared`: the shared
    experts' slots appended to every token's picks (in the same kernel on CUDA)."""
    if router_logits.is_cuda:
        return route_grouped_triton(router_logits, config, correction_bias, shared)
    weights, ids = select_experts_grouped_native(router_logits, config, correction_bias)
    if shared is None:
        return weights, ids
    t = ids.shape[0]
    shared_ids = torch.arange(shared.first, shared.first + shared.count, dtype=ids.dtype).expand(t, -1)
    return torch.cat([weights, weights.new_ones(t, shared.count)], 1), torch.cat([ids, shared_ids], 1)


def route_grouped_triton(
    router_logits: torch.Tensor,
    config: GroupedTopKConfig,
    correction_bias: Optional[torch.Tensor] = None,
    shared: Optional[SharedExpertSlots] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`config`'s routing as the one triton kernel computes it (CUDA, or the interpreter in the CPU tests)."""
    from sglang.srt.layers.moe.topk_triton import route_topk_triton

    noaux = config.topk_method == "noaux_tc"
    grouped = config.topk_method != "greedy"
    return route_topk_triton(
        router_logits,
        config.top_k,
        sigmoid=noaux,
        n_group=config.n_group if grouped else 1,
        topk_group=config.topk_group if grouped else 1,
        group_score=("top2_sum" if noaux else "max") if grouped else "none",
        correction_bias=correction_bias if noaux else None,
        renormalize=config.renormalize,
        renorm_eps=GROUPED_RENORM_EPS,
        scaling=config.routed_scaling_factor,
        append=(0, 0) if shared is None else (shared.first, shared.count),
    )


def select_experts_grouped_native(
    router_logits: torch.Tensor, config: GroupedTopKConfig, correction_bias: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights fp32 [T, k], topk_ids int32 [T, k]), DeepSeek's routing (above).
    Everything in fp32, as the reference computes its router."""
    logits = router_logits.float()
    t, experts = logits.shape
    if config.topk_method == "noaux_tc":
        scores = logits.sigmoid()
        choice = scores if correction_bias is None else scores + correction_bias.float()
        group_scores = choice.view(t, config.n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
        choice = _keep_best_groups(choice, group_scores, config.topk_group, float("-inf"))
        ids = torch.topk(choice, k=config.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
    else:
        scores = logits.softmax(dim=-1)
        if config.topk_method == "group_limited_greedy":
            group_scores = scores.view(t, config.n_group, -1).max(dim=-1).values
            scores = _keep_best_groups(scores, group_scores, config.topk_group, 0.0)
        weights, ids = torch.topk(scores, k=config.top_k, dim=-1, sorted=False)
    if config.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + GROUPED_RENORM_EPS)
    return weights * config.routed_scaling_factor, ids.to(torch.int32)
