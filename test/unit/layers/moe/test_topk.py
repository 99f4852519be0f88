"""DeepSeek routing (layers/moe/topk.py) against transformers' own router modules on the same weights:
V2 greedy and group_limited_greedy (softmax), V3 noaux_tc (sigmoid + correction bias, grouped top-k)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=7, suite="per-commit-cpu")

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from sglang.srt.layers.moe.topk import (
    GroupedTopKConfig,
    SharedExpertSlots,
    route_grouped_triton,
    select_experts,
    select_experts_grouped,
    select_experts_grouped_native,
    select_experts_native,
)
from sglang.srt.layers.moe.topk_triton import route_topk_triton
from sglang.test.gpu_utils import triton_test_devices

HIDDEN, EXPERTS, TOKENS = 32, 16, 64


def _by_expert(weights: torch.Tensor, ids: torch.Tensor):
    """(ids, weights) of each token sorted by expert id: the order of the k picks does not matter."""
    order = ids.long().argsort(dim=-1)
    return ids.long().gather(1, order), weights.float().gather(1, order)


def _check(router, config: GroupedTopKConfig, bias=None):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(EXPERTS, HIDDEN, generator=gen))
    h = torch.randn(TOKENS, HIDDEN, generator=gen)
    _, ref_w, ref_ids = router(h)
    logits = torch.nn.functional.linear(h, router.weight)
    w, ids = select_experts_grouped(logits, config, bias)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.shape == (TOKENS, config.top_k)
    ours_ids, ours_w = _by_expert(w, ids)
    ref_ids, ref_w = _by_expert(ref_w, ref_ids)
    assert torch.equal(ours_ids, ref_ids)
    torch.testing.assert_close(ours_w, ref_w, rtol=1e-6, atol=1e-7)
    return ours_ids, ours_w, logits


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_v2_softmax_routing_matches_transformers(method):
    hf = DeepseekV2Config(
        hidden_size=HIDDEN, n_routed_experts=EXPERTS, num_experts_per_tok=3, topk_method=method, n_group=4,
        topk_group=2, routed_scaling_factor=1.5,
    )  # fmt: skip
    cfg = GroupedTopKConfig(3, method, n_group=4, topk_group=2, renormalize=False, routed_scaling_factor=1.5)
    ids, _, _ = _check(DeepseekV2TopkRouter(hf), cfg)
    if method == "group_limited_greedy":  # every pick lies in at most topk_group groups of 4 experts
        assert all(len(set((row // 4).tolist())) <= 2 for row in ids)


@pytest.mark.parametrize("renormalize", [True, False])
def test_v3_noaux_tc_routing_matches_transformers(renormalize):
    hf = DeepseekV3Config(
        hidden_size=HIDDEN, n_routed_experts=EXPERTS, num_experts_per_tok=4, n_group=4, topk_group=2,
        norm_topk_prob=renormalize, routed_scaling_factor=2.5,
    )  # fmt: skip
    router = DeepseekV3TopkRouter(hf)
    bias = torch.linspace(-0.5, 0.5, EXPERTS)  # large enough to change choices: the bias must be applied
    router.e_score_correction_bias.copy_(bias)
    cfg = GroupedTopKConfig(4, "noaux_tc", n_group=4, topk_group=2, renormalize=renormalize, routed_scaling_factor=2.5)
    ids, w, logits = _check(router, cfg, bias)
    assert all(len(set((row // 4).tolist())) <= 2 for row in ids)
    if renormalize:  # weights sum to the scaling factor
        torch.testing.assert_close(w.sum(-1), torch.full((TOKENS,), 2.5))
    # The bias changes some token's choice (a routing that ignored it would not pass the check above).
    assert not torch.equal(ids, _by_expert(*select_experts_grouped(logits, cfg))[0])


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="topk_method"):
        GroupedTopKConfig(2, "sqrtsoftplus")


# ---------------------------------------------------------------- the triton routing kernel (the CUDA path)

DEVICES = triton_test_devices()


def _sorted_by_expert(weights: torch.Tensor, ids: torch.Tensor):
    ids, weights = _by_expert(weights.cpu(), ids.cpu())
    return ids, weights


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k", [(64, 6), (60, 4), (8, 2)])  # V2-Lite, Qwen2-MoE (not a power of 2), Mixtral
def test_softmax_topk_kernel_matches_torch(device, dtype, renormalize, experts, top_k):
    gen = torch.Generator().manual_seed(3)
    # Distinct logits per row (a permutation / 16, exact in bf16): no ties the two could break differently.
    logits = (torch.stack([torch.randperm(experts, generator=gen) for _ in range(9)]) / 16).to(device, dtype)
    w, ids = route_topk_triton(logits, top_k, renormalize=renormalize)
    ref_w, ref_ids = select_experts_native(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.shape == (9, top_k)
    assert torch.equal(ids.cpu(), ref_ids.cpu())  # same experts, same (descending) order as torch.topk
    torch.testing.assert_close(w.cpu(), ref_w.cpu(), rtol=1e-5, atol=1e-7)
    if device == "cuda":  # select_experts dispatches CUDA logits to the kernel
        assert torch.equal(select_experts(logits, top_k, renormalize)[1], ids)


GROUPED_KERNEL_CASES = [
    # (config, experts): V2-Lite's greedy, V2's group_limited_greedy, V3's noaux_tc (256 experts, 8 groups)
    (GroupedTopKConfig(6, "greedy", routed_scaling_factor=1.0), 64),
    (GroupedTopKConfig(3, "group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5), 16),
    (GroupedTopKConfig(8, "noaux_tc", n_group=8, topk_group=4, renormalize=True, routed_scaling_factor=2.5), 256),
    (GroupedTopKConfig(4, "noaux_tc", n_group=4, topk_group=2, renormalize=False, routed_scaling_factor=2.5), 16),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config,experts", GROUPED_KERNEL_CASES)
def test_grouped_topk_kernel_matches_torch(device, config, experts):
    gen = torch.Generator().manual_seed(experts)
    logits = torch.randn(TOKENS, experts, generator=gen).to(device)
    bias = (torch.randn(experts, generator=gen) * 0.3).to(device)
    ref_ids, ref_w = _sorted_by_expert(*select_experts_grouped_native(logits, config, bias))
    w, ids = route_grouped_triton(logits, config, bias)
    ids, w = _sorted_by_expert(w, ids)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-7)
    if config.topk_method != "greedy":  # every pick inside topk_group groups
        size = experts // config.n_group
        assert all(len(set((row // size).tolist())) <= config.topk_group for row in ids)
    if device == "cuda":  # select_experts_grouped dispatches CUDA logits to the kernel with these arguments
        got_ids, got_w = _sorted_by_expert(*select_experts_grouped(logits, config, bias))
        assert torch.equal(got_ids, ids)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config,experts", [GROUPED_KERNEL_CASES[0], GROUPED_KERNEL_CASES[2]])
@pytest.mark.parametrize("shared", [1, 2])
def test_shared_experts_appended_as_slots(device, config, experts, shared):
    """Shared experts run as routed ones: after the k picks, `count` slots name experts first.. with weight 1 (not
    scaled, not renormalised with the picks), in the kernel as in torch; the picks themselves unchanged."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(TOKENS, experts, generator=gen).to(device)
    bias = (torch.randn(experts, generator=gen) * 0.3).to(device)
    slots = SharedExpertSlots(first=experts, count=shared)
    alone = select_experts_grouped_native(logits.cpu(), config, bias.cpu())
    for w, ids in (select_experts_grouped(logits.cpu(), config, bias.cpu(), slots),
                   route_grouped_triton(logits, config, bias, slots)):  # fmt: skip
        w, ids = w.cpu(), ids.cpu()
        assert ids.shape == w.shape == (TOKENS, config.top_k + shared) and ids.dtype == torch.int32
        assert torch.equal(
            ids[:, config.top_k :], torch.arange(experts, experts + shared, dtype=torch.int32).expand(TOKENS, -1)
        )
        assert torch.equal(w[:, config.top_k :], torch.ones(TOKENS, shared))
        picks = _sorted_by_expert(w[:, : config.top_k], ids[:, : config.top_k])
        ref = _sorted_by_expert(*alone)
        assert torch.equal(picks[0], ref[0])
        torch.testing.assert_close(picks[1], ref[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_breaks_ties_by_lowest_expert(device):
    """Equal scores (the documented rule): the lowest expert index wins, picks in descending score order."""
    logits = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.0]], device=device)
    _, ids = route_topk_triton(logits, 3)
    assert ids.cpu().tolist() == [[1, 3, 5]]
    _, ids = route_topk_triton(logits, 4)
    assert ids.cpu().tolist() == [[1, 3, 5, 4]]
