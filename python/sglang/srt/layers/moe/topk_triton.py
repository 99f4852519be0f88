"""Router top-k in one triton kernel per call (one program per token row, all experts in one block).

The GPU path of layers/moe/topk.py: the torch code there is the CPU path and the reference, and this
kernel computes the same routing (same ids, weights to fp32 rounding). It replaces ~5-15 torch launches
(softmax / sigmoid, bias add, group scores, group top-k, scatter, mask, top-k, gather, renormalise,
scale, dtype casts) by one, which is what a CUDA-graph decode step pays for per MoE layer.

Ties: the kernel picks the lowest expert index among equal scores (and the lowest group index among
equal group scores); torch.topk leaves the order of ties unspecified, so on exact ties the two may pick
different (equal-scored) experts. The k picks come out in descending score order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.pdl import pdl_available, pdl_prologue

# Score functions and group scores, as kernel constants.
_SOFTMAX: tl.constexpr = tl.constexpr(0)
_SIGMOID: tl.constexpr = tl.constexpr(1)
_GROUP_NONE: tl.constexpr = tl.constexpr(0)
_GROUP_MAX: tl.constexpr = tl.constexpr(1)  # V2 group_limited_greedy: a group's best expert
_GROUP_TOP2_SUM: tl.constexpr = tl.constexpr(2)  # V3 noaux_tc: the sum of a group's two best


@triton.jit
def _route_topk_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    stride_t, scaling,
    TOP_K: tl.constexpr, N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr,
    SCORE: tl.constexpr, GROUP_SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, WEIGHT_FROM_SCORES: tl.constexpr,
    RENORMALIZE: tl.constexpr, RENORM_EPS: tl.constexpr, N_APPEND: tl.constexpr, append_first,
    G_PAD: tl.constexpr, S_PAD: tl.constexpr, K_PAD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    # Experts as a [group, index in group] block: expert = g * GROUP_SIZE + j (one group when ungrouped).
    g1 = tl.arange(0, G_PAD)
    g = g1[:, None]
    j = tl.arange(0, S_PAD)[None, :]
    valid = (g < N_GROUP) & (j < GROUP_SIZE)
    expert = g * GROUP_SIZE + j
    x = tl.load(logits_ptr + row * stride_t + expert, mask=valid, other=float("-inf")).to(tl.float32)
    if SCORE == _SOFTMAX:
        p = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        p = tl.where(valid, p, 0.0)
        scores = p / tl.sum(tl.sum(p, axis=1), axis=0)
    else:
        scores = tl.sigmoid(x)
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + expert, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))  # padding experts are never picked

    if GROUP_SCORE != _GROUP_NONE:
        if GROUP_SCORE == _GROUP_MAX:
            group_score = tl.max(choice, axis=1)
            fill = 0.0  # what the reference masks dropped groups with (softmax scores are > 0)
        else:
            best = tl.max(choice, axis=1)
            best_j = tl.min(tl.where(choice == best[:, None], j, S_PAD), axis=1)
            group_score = best + tl.max(tl.where(j == best_j[:, None], float("-inf"), choice), axis=1)
            fill = float("-inf")
        keep = g1 < 0  # all False
        for _ in tl.static_range(TOPK_GROUP):
            avail = (g1 < N_GROUP) & ~keep
            top = tl.max(tl.where(avail, group_score, float("-inf")), axis=0)
            pick = tl.min(tl.where(avail & (group_score == top), g1, G_PAD), axis=0)
            keep = keep | (g1 == pick)
        choice = tl.where(valid, tl.where(keep[:, None], choice, fill), float("-inf"))

    source = scores if WEIGHT_FROM_SCORES else choice  # noaux_tc weighs by the scores without the bias
    kk = tl.arange(0, K_PAD)
    top_w = tl.zeros((K_PAD,), dtype=tl.float32)
    top_ids = tl.zeros((K_PAD,), dtype=tl.int32)
    taken = expert < 0  # all False
    for i in tl.static_range(TOP_K):
        avail = valid & ~taken
        top = tl.max(tl.max(tl.where(avail, choice, float("-inf")), axis=1), axis=0)
        pick = tl.min(tl.min(tl.where(avail & (choice == top), expert, N_GROUP * GROUP_SIZE), axis=1), axis=0)
        hit = expert == pick
        w = tl.sum(tl.sum(tl.where(hit, source, 0.0), axis=1), axis=0)
        top_w = tl.where(kk == i, w, top_w)
        top_ids = tl.where(kk == i, pick, top_ids)
        taken = taken | hit
    if RENORMALIZE:
        top_w = top_w / (tl.sum(top_w, axis=0) + RENORM_EPS)
    top_w = top_w * scaling
    if N_APPEND > 0:  # shared experts run as routed ones: slots TOP_K.. name them, weight 1, unscaled
        appended = (kk >= TOP_K) & (kk < TOP_K + N_APPEND)
        top_w = tl.where(appended, 1.0, top_w)
        top_ids = tl.where(appended, append_first + kk - TOP_K, top_ids)
    out = row * (TOP_K + N_APPEND) + kk
    tl.store(weights_ptr + out, top_w, mask=kk < TOP_K + N_APPEND)
    tl.store(ids_ptr + out, top_ids, mask=kk < TOP_K + N_APPEND)


def route_topk_triton(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    sigmoid: bool = False,
    n_group: int = 1,
    topk_group: int = 1,
    group_score: str = "none",
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = False,
    renorm_eps: float = 0.0,
    scaling: float = 1.0,
    append: tuple[int, int] = (0, 0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] (any float dtype, read as fp32) -> (weights fp32 [T, k + n], ids int32 [T, k + n]).
    group_score: "none", "max" (fill dropped groups with 0) or "top2_sum" (fill with -inf). Weights are the
    scores without the bias when sigmoid (noaux_tc), else the (group-masked) scores. `append` (first, n): n more
    slots after the k picks, experts first .. first + n - 1 with weight 1 (shared experts run as routed ones)."""
    num_tokens, num_experts = router_logits.shape
    if num_experts % n_group or not 1 <= top_k <= num_experts:
        raise ValueError(f"{num_experts} experts, {n_group} groups, top_k {top_k}: unsupported routing")
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    append_first, n_append = append
    weights = torch.empty((num_tokens, top_k + n_append), dtype=torch.float32, device=logits.device)
    ids = torch.empty((num_tokens, top_k + n_append), dtype=torch.int32, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    group_size = num_experts // n_group
    groups = {"none": _GROUP_NONE, "max": _GROUP_MAX, "top2_sum": _GROUP_TOP2_SUM}[group_score]
    pdl = pdl_available(logits)
    _route_topk_kernel[(num_tokens,)](
        logits, correction_bias if correction_bias is not None else logits, weights, ids,
        logits.stride(0), scaling,
        TOP_K=top_k, N_GROUP=n_group, GROUP_SIZE=group_size, TOPK_GROUP=topk_group,
        SCORE=_SIGMOID if sigmoid else _SOFTMAX, GROUP_SCORE=groups, HAS_BIAS=correction_bias is not None,
        WEIGHT_FROM_SCORES=sigmoid, RENORMALIZE=renormalize, RENORM_EPS=renorm_eps,
        N_APPEND=n_append, append_first=append_first,
        G_PAD=triton.next_power_of_2(n_group), S_PAD=triton.next_power_of_2(group_size),
        K_PAD=triton.next_power_of_2(top_k + n_append), PDL=pdl,
        num_warps=2, launch_pdl=pdl,
    )  # fmt: skip
    return weights, ids
