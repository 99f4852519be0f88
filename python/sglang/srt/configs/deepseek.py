"""Facts about DeepSeek-family configs (DeepSeek-V2/V2-Lite, V3/R1, Kimi-K2): which ones we run exactly,
and the start-up refusal, naming the field, of everything else (checked before any weight loads).

What we run (models/deepseek_v2.py), as transformers' DeepseekV2/DeepseekV3 modeling files compute it:
- V2 (`deepseek_v2`): softmax scores, `topk_method` greedy or group_limited_greedy, top-k weights times
  `routed_scaling_factor` (transformers' V2 never renormalises them: `norm_topk_prob` true is refused, the
  original remote code would renormalise *instead of* scaling, and there is no reference to check that
  against).
- V3 (`deepseek_v3`, Kimi-K2's `kimi_k2`): `noaux_tc`, sigmoid scores, grouped choice over scores +
  `e_score_correction_bias`, `norm_topk_prob`, `routed_scaling_factor`.
"""

from __future__ import annotations

from transformers import PretrainedConfig

DEEPSEEK_V2_ARCH = "DeepseekV2ForCausalLM"
DEEPSEEK_V3_ARCH = "DeepseekV3ForCausalLM"
# model_type values whose config class is transformers' DeepseekV3Config (Kimi-K2's remote
# configuration_deepseek.py defines exactly that config): loaded without running the checkpoint's code.
DEEPSEEK_V3_CONFIG_ALIASES = {"kimi_k2": "deepseek_v3"}

V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
V3_TOPK_METHOD = "noaux_tc"
V2_SCORING = "softmax"
V3_SCORING = "sigmoid"
# DeepSeek-V3.2's sparse attention (the lightning indexer) is configured by these; V3.2 is not run here.
SPARSE_ATTENTION_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")


class UnsupportedModelError(ValueError):
    """A config we cannot run exactly; the message names the field."""


def is_deepseek_family(config: PretrainedConfig) -> bool:
    model_type = getattr(config, "model_type", "") or ""
    archs = getattr(config, "architectures", None) or []
    return (
        model_type.startswith("deepseek")
        or model_type in DEEPSEEK_V3_CONFIG_ALIASES
        or any(a.startswith("Deepseek") for a in archs)
    )


def uses_mla(config: PretrainedConfig) -> bool:
    """Multi-head latent attention: the config has a KV latent rank."""
    return getattr(config, "kv_lora_rank", None) is not None


def _field(config: PretrainedConfig, name: str):
    return getattr(config, name, None)


def check_deepseek_config(config: PretrainedConfig) -> None:
    """Raise UnsupportedModelError naming the first field of a DeepSeek-family config we do not run exactly."""
    if not is_deepseek_family(config):
        return
    model_type = _field(config, "model_type") or ""
    archs = _field(config, "architectures") or []
    if model_type == "deepseek_v4" or any("V4" in a for a in archs):
        raise UnsupportedModelError(
            f"DeepSeek-V4 (model_type {model_type!r}, architectures {archs}) is not supported: its attention and "
            "routing differ from DeepSeek-V3's"
        )
    present = [name for name in SPARSE_ATTENTION_FIELDS if _field(config, name) is not None]
    if model_type == "deepseek_v32" or any("V32" in a for a in archs) or present:
        named = present[0] if present else "architectures"
        raise UnsupportedModelError(
            f"DeepSeek-V3.2 sparse attention ({named}={_field(config, named)!r}) is not supported; dense MLA "
            "(DeepSeek-V2/V3, Kimi-K2) is"
        )
    arch = archs[0] if archs else {"deepseek_v2": DEEPSEEK_V2_ARCH}.get(model_type, DEEPSEEK_V3_ARCH)
    if arch not in (DEEPSEEK_V2_ARCH, DEEPSEEK_V3_ARCH):
        return  # not ours: the registry refuses the architecture by name
    v3 = arch == DEEPSEEK_V3_ARCH
    topk_method = _field(config, "topk_method")
    allowed_topk = (V3_TOPK_METHOD,) if v3 else V2_TOPK_METHODS
    if topk_method is not None and topk_method not in allowed_topk:
        raise UnsupportedModelError(
            f"topk_method={topk_method!r} is not supported for {arch} (supported: {', '.join(allowed_topk)})"
        )
    scoring = _field(config, "scoring_func")
    allowed_scoring = V3_SCORING if v3 else V2_SCORING
    if scoring is not None and scoring != allowed_scoring:
        raise UnsupportedModelError(
            f"scoring_func={scoring!r} is not supported for {arch} (supported: {allowed_scoring})"
        )
    if not v3 and _field(config, "norm_topk_prob"):
        raise UnsupportedModelError(
            f"norm_topk_prob=True is not supported for {arch}: transformers' DeepSeek-V2 scales the top-k "
            "weights by routed_scaling_factor and never renormalises them"
        )
    freq = _field(config, "moe_layer_freq")
    if freq is not None and freq != 1:
        raise UnsupportedModelError(
            f"moe_layer_freq={freq} is not supported (every layer from first_k_dense_replace on is MoE)"
        )
    act = _field(config, "hidden_act")
    if act not in (None, "silu"):
        raise UnsupportedModelError(f"hidden_act={act!r} is not supported (silu)")
    if _field(config, "mlp_bias"):
        raise UnsupportedModelError("mlp_bias=True is not supported")
    if _field(config, "attention_bias"):
        raise UnsupportedModelError("attention_bias=True is not supported")
    experts = _field(config, "n_routed_experts") or 0
    grouped = v3 or topk_method == "group_limited_greedy"
    if experts and grouped:
        n_group, topk_group = _field(config, "n_group"), _field(config, "topk_group")
        if not n_group or experts % n_group:
            raise UnsupportedModelError(f"n_group={n_group!r} must divide n_routed_experts={experts}")
        if not topk_group or not 0 < topk_group <= n_group:
            raise UnsupportedModelError(f"topk_group={topk_group!r} must be in [1, n_group={n_group}]")
        if v3 and experts // n_group < 2:
            raise UnsupportedModelError(
                f"n_group={n_group}: each group needs at least 2 experts (a group's score is its top-2 sum)"
            )


def mtp_layer_count(config: PretrainedConfig) -> int:
    """Multi-token-prediction (NextN) layers the checkpoint appends after num_hidden_layers; not run here."""
    return int(_field(config, "num_nextn_predict_layers") or 0)
