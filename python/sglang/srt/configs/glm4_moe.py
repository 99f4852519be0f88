"""Facts about GLM-4.5-family configs (Glm4MoeForCausalLM: GLM-4.5, 4.5-Air, 4.6, 4.7): what we run exactly, and
the start-up refusal, naming the field, of everything else (checked before any weight loads).

What we run (models/glm4_moe.py), as transformers' modeling_glm4_moe.py computes it: GQA attention with q/k/v
biases (attention_bias; o_proj never has one), per-head q/k RMSNorm before rotary (use_qk_norm), rotate-half
rotary over each head's first head_dim x partial_rotary_factor values with the default (unscaled) frequencies;
DeepSeek-V3's noaux_tc routing (sigmoid scores, grouped choice over scores + e_score_correction_bias, norm_topk_prob,
routed_scaling_factor), shared experts, the first first_k_dense_replace layers dense. The multi-token-prediction
layers (num_nextn_predict_layers) are not part of the forward.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from sglang.srt.configs.deepseek import V3_SCORING, V3_TOPK_METHOD, UnsupportedModelError

GLM4_MOE_ARCH = "Glm4MoeForCausalLM"
# transformers' Glm4MoeRotaryEmbedding takes any rope type, but only the default one is a table we can precompute
# and have checked against it; GLM-4.5/4.6/4.7 ship rope_scaling null.
GLM4_MOE_ROPE_TYPES = ("default",)


def is_glm4_moe(config: PretrainedConfig) -> bool:
    archs = getattr(config, "architectures", None) or []
    return getattr(config, "model_type", None) == "glm4_moe" or GLM4_MOE_ARCH in archs


def _rope_type(config: PretrainedConfig) -> tuple[str, str]:
    """(the field that names it, the rope type)."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return "rope_parameters.rope_type", params.get("rope_type", params.get("type", "default"))
    scaling = getattr(config, "rope_scaling", None) or {}
    return "rope_scaling.rope_type", scaling.get("rope_type", scaling.get("type", "default"))


def check_glm4_moe_config(config: PretrainedConfig) -> None:
    """Raise UnsupportedModelError naming the first field of a GLM-4.5 config we do not run exactly."""
    if not is_glm4_moe(config):
        return
    field, rope_type = _rope_type(config)
    if rope_type not in GLM4_MOE_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{field}={rope_type!r} is not supported for {GLM4_MOE_ARCH} (supported: {', '.join(GLM4_MOE_ROPE_TYPES)})"
        )
    # transformers' GLM router is always DeepSeek-V3's; a config asking for another would be answered wrongly.
    for name, ours in (("topk_method", V3_TOPK_METHOD), ("scoring_func", V3_SCORING)):
        value = getattr(config, name, None)
        if value is not None and value != ours:
            raise UnsupportedModelError(f"{name}={value!r} is not supported for {GLM4_MOE_ARCH} (supported: {ours})")
    experts = getattr(config, "n_routed_experts", None) or 0
    if not experts:
        return
    n_group, topk_group = config.n_group, config.topk_group
    if not n_group or experts % n_group:
        raise UnsupportedModelError(f"n_group={n_group!r} must divide n_routed_experts={experts}")
    if experts // n_group < 2:
        raise UnsupportedModelError(
            f"n_group={n_group}: each group needs at least 2 experts (a group's score is its top-2 sum)"
        )
    if not topk_group or not 0 < topk_group <= n_group:
        raise UnsupportedModelError(f"topk_group={topk_group!r} must be in [1, n_group={n_group}]")
    eligible = topk_group * (experts // n_group)
    if config.num_experts_per_tok > eligible:
        raise UnsupportedModelError(
            f"num_experts_per_tok={config.num_experts_per_tok} is more than the {eligible} experts of the "
            f"topk_group={topk_group} groups a token may use"
        )
