"""configs/model_config.py: the facts ModelConfig reads from HF configs of every family we run."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="per-commit-cpu")

import pytest
from transformers import DeepseekV2Config, LlamaConfig, MixtralConfig, Qwen3MoeConfig

from sglang.srt.configs.model_config import num_routed_experts


@pytest.mark.parametrize(
    "config, experts",
    [
        (DeepseekV2Config(n_routed_experts=64), 64),  # DeepSeek/GLM/Kimi: n_routed_experts
        (MixtralConfig(num_local_experts=8), 8),  # Mixtral: num_local_experts
        (Qwen3MoeConfig(num_experts=128), 128),  # Qwen-MoE: num_experts
        (LlamaConfig(), 0),  # dense
    ],
)
def test_num_routed_experts_reads_each_familys_field(config, experts):
    assert num_routed_experts(config) == experts


@pytest.mark.parametrize(
    "config_cls,fields,named",
    [
        ("MixtralConfig", dict(hidden_act="gelu"), "hidden_act='gelu'"),
        ("Qwen2MoeConfig", dict(hidden_act="relu"), "hidden_act='relu'"),
        ("OlmoeConfig", dict(hidden_act="gelu_new"), "hidden_act='gelu_new'"),
        ("LlamaConfig", dict(mlp_bias=True), "mlp_bias=True"),
    ],
)
def test_mlp_fields_we_do_not_run_are_refused_by_name(config_cls, fields, named):
    """An activation other than SiLU or an MLP bias would load and answer wrongly: refused, naming the field."""
    import transformers

    from sglang.srt.configs.deepseek import UnsupportedModelError
    from sglang.srt.configs.model_config import check_model_supported

    config = getattr(transformers, config_cls)(**fields)
    with pytest.raises(UnsupportedModelError, match=named.replace("(", r"\(")):
        check_model_supported(config)
    check_model_supported(getattr(transformers, config_cls)())  # the family's defaults run
