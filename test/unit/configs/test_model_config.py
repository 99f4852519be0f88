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


# One case per start-up refusal of docs/model_support.md's table: (config class, fields, the name the error gives).
ARCHITECTURE_FIELD_REFUSALS = [
    ("LlamaConfig", dict(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}), "rope_type='proportional'"),
    ("LlamaConfig", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    ("Qwen3Config", dict(partial_rotary_factor=0.25), "partial_rotary_factor=0.25"),
    ("MistralConfig", dict(attention_bias=True), "attention_bias=True"),
    ("MixtralConfig", dict(attention_bias=True), "attention_bias=True"),
    ("Qwen2MoeConfig", dict(attention_bias=True, qkv_bias=False), "attention_bias=True"),
    ("LlamaConfig", dict(sliding_window=16), "sliding_window=16"),
    ("OlmoeConfig", dict(sliding_window=16), "sliding_window=16"),
    ("Qwen2Config", dict(layer_types=["full_attention", "chunked_attention"], num_hidden_layers=2), "layer_types"),
]


@pytest.mark.parametrize("config_cls,fields,named", ARCHITECTURE_FIELD_REFUSALS)
def test_architecture_fields_we_do_not_run_are_refused_by_name(config_cls, fields, named):
    """Fields that transformers' modeling file for the architecture computes differently from our shared code:
    refused at start-up (ModelConfig, before any weight), naming the field; the family's defaults run."""
    import transformers

    from sglang.srt.configs.deepseek import UnsupportedModelError
    from sglang.srt.configs.model_config import ModelConfig

    arch = config_cls.replace("Config", "ForCausalLM")
    config = getattr(transformers, config_cls)(**fields, architectures=[arch])
    with pytest.raises(UnsupportedModelError, match=named.replace("(", r"\(")):
        ModelConfig.from_hf_config(config)
    ModelConfig.from_hf_config(getattr(transformers, config_cls)(architectures=[arch]))


@pytest.mark.parametrize(
    "config_cls,fields",
    [
        (
            "Phi3Config",
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}),
        ),
        ("Qwen2Config", dict(attention_bias=True)),  # transformers' Qwen2 ignores it; so does our Qwen2 o_proj
        ("Phi3Config", dict(attention_bias=True)),  # transformers' Phi3 ignores it; our Phi3Attention too
        ("MistralConfig", dict(sliding_window=16)),
        ("Qwen3Config", dict(attention_bias=True)),
    ],
)
def test_fields_we_honour_are_accepted(config_cls, fields):
    import transformers

    from sglang.srt.configs.model_config import ModelConfig

    arch = config_cls.replace("Config", "ForCausalLM")
    ModelConfig.from_hf_config(getattr(transformers, config_cls)(**fields, architectures=[arch]))


def test_longrope_context_is_original_max_position_embeddings():
    """transformers re-rotates every position with the long factors past original_max_position_embeddings (a KV
    cache cannot follow): the context stops there, a longer --context-length is refused naming the field."""
    from transformers import Phi3Config

    from sglang.srt.configs.model_config import ModelConfig

    rope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}
    config = Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=1024,
        original_max_position_embeddings=256,
        rope_parameters=rope,
        architectures=["Phi3ForCausalLM"],
    )
    assert ModelConfig.from_hf_config(config).context_len == 256
    assert ModelConfig.from_hf_config(config, context_length=200).context_len == 200
    with pytest.raises(ValueError, match="original_max_position_embeddings 256"):
        ModelConfig.from_hf_config(config, context_length=257)


def test_a_config_without_architectures_gets_its_model_types_class():
    from transformers import Gemma2Config, MistralConfig, PretrainedConfig

    from sglang.srt.configs.deepseek import UnsupportedModelError
    from sglang.srt.configs.model_config import architecture_of

    assert architecture_of(Gemma2Config()) == "Gemma2ForCausalLM"  # not served as a Llama
    assert architecture_of(MistralConfig()) == "MistralForCausalLM"
    assert architecture_of(MistralConfig(architectures=["LlamaForCausalLM"])) == "LlamaForCausalLM"
    with pytest.raises(UnsupportedModelError, match="names no architectures"):
        architecture_of(PretrainedConfig())
