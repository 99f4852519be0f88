"""GLM-4.5 configs (configs/glm4_moe.py): what we run is accepted with the facts the runtime reads (routed experts
through the one MoE field-name helper, GQA KV heads, head_dim), and every field we do not run is refused at start-up
by name, before any weight loads."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="per-commit-cpu")

import pytest
from transformers import Glm4MoeConfig

from sglang.srt.configs.deepseek import UnsupportedModelError
from sglang.srt.configs.model_config import ModelConfig, check_model_supported, num_routed_experts

# GLM-4.5-Air as its config.json says (transformers 4 layout: partial_rotary_factor and rope_theta at the top).
AIR = dict(
    architectures=["Glm4MoeForCausalLM"],
    hidden_size=4096,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=46,
    num_attention_heads=96,
    num_key_value_heads=8,
    head_dim=128,
    n_routed_experts=128,
    n_shared_experts=1,
    num_experts_per_tok=8,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    attention_bias=True,
    use_qk_norm=False,
    partial_rotary_factor=0.5,
    rope_theta=1000000,
    rope_scaling=None,
    num_nextn_predict_layers=1,
    max_position_embeddings=131072,
    vocab_size=151552,
)


def _config(**overrides) -> Glm4MoeConfig:
    return Glm4MoeConfig.from_dict({**AIR, **overrides})


def test_glm_air_facts():
    config = _config()
    assert num_routed_experts(config) == 128  # n_routed_experts, through the one helper
    model = ModelConfig.from_hf_config(config)
    assert model.architecture == "Glm4MoeForCausalLM" and model.is_moe and model.attention == "mha"
    assert (model.num_key_value_heads, model.head_dim, model.v_head_dim) == (8, 128, 128)
    assert model.kv_geometry().cell_size_bytes == 46 * 8 * 256 * 4  # fp32 KV on the CPU


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), "yarn"),
        (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "'dynamic'"),
        (dict(topk_method="greedy"), "topk_method='greedy'"),
        (dict(scoring_func="softmax"), "scoring_func='softmax'"),
        (dict(n_group=3, topk_group=1), "n_group=3 must divide n_routed_experts=128"),
        (dict(n_group=128, topk_group=1), "n_group=128: each group needs at least 2 experts"),
        (dict(n_group=4, topk_group=5), "topk_group=5 must be in"),
        (dict(n_group=8, topk_group=1, num_experts_per_tok=20), "num_experts_per_tok=20"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ],
)
def test_fields_we_do_not_run_are_refused_by_name(fields, named):
    config = _config(**fields)
    with pytest.raises(UnsupportedModelError, match=named.replace("(", r"\(")):
        check_model_supported(config)


def test_what_we_run_is_accepted():
    check_model_supported(_config())  # GLM-4.5-Air
    # GLM-4.5 (qk-norm, 160 experts in one group, scaling 2.5) and a grouped router.
    check_model_supported(_config(use_qk_norm=True, n_routed_experts=160, routed_scaling_factor=2.5))
    check_model_supported(_config(n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid"))
    check_model_supported(Glm4MoeConfig())  # transformers' defaults
