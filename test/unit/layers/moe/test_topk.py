"""DeepSeek routing (layers/moe/topk.py) against transformers' own router modules on the same weights:
V2 greedy and group_limited_greedy (softmax), V3 noaux_tc (sigmoid + correction bias, grouped top-k)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=7, suite="per-commit-cpu")

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from sglang.srt.layers.moe.topk import GroupedTopKConfig, select_experts_grouped

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
