"""Router top-k selection: the single routing code path for CPU and GPU experts."""

from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
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
