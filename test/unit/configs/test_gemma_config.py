"""configs/gemma.py through check_model_supported: the Gemma 2/3 configs we run pass, every Gemma field that would
change the math in a way we do not run is refused by name, the activation rule stays SiLU-only for everything else,
and the multimodal Gemma 3 is refused with a message naming the text model we do serve."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

import pytest
from transformers import Gemma2Config, Gemma3Config, Gemma3TextConfig, LlamaConfig

from sglang.srt.configs.deepseek import UnsupportedModelError
from sglang.srt.configs.model_config import check_model_supported


def test_the_gemma_configs_we_run_pass():
    check_model_supported(Gemma2Config())  # the defaults: attention and final soft-capping, alternating windows
    # A Hub config.json carries hidden_act too; transformers' Gemma modeling reads only hidden_activation.
    check_model_supported(Gemma2Config(hidden_act="gelu_pytorch_tanh"))
    check_model_supported(Gemma3TextConfig())
    check_model_supported(
        Gemma3TextConfig(rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=10000.0)
    )


@pytest.mark.parametrize(
    "config,named",
    [
        (lambda: Gemma2Config(hidden_activation="gelu"), "hidden_activation='gelu'"),
        (lambda: Gemma3TextConfig(hidden_activation="silu"), "hidden_activation='silu'"),
        (lambda: Gemma2Config(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (lambda: Gemma3TextConfig(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (lambda: Gemma3TextConfig(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
        (
            lambda: Gemma3TextConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
            "rope_parameters['full_attention']['rope_type']='dynamic'",
        ),
        (
            lambda: Gemma2Config(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
            "rope_parameters['rope_type']='dynamic'",
        ),
        (
            lambda: Gemma2Config(num_hidden_layers=2, layer_types=["sliding_attention", "chunked_attention"]),
            "chunked_attention",
        ),
        (lambda: Gemma2Config(sliding_window=None), "sliding_window None"),
    ],
)
def test_gemma_fields_we_do_not_run_are_refused_by_name(config, named):
    with pytest.raises(UnsupportedModelError, match=named.replace("[", r"\[").replace("(", r"\(")):
        check_model_supported(config())


def test_gemma_activation_is_not_allowed_for_other_families():
    """The GeGLU activation is Gemma's own: a Llama asking for it is still refused (its MLP is SwiGLU)."""
    with pytest.raises(UnsupportedModelError, match="hidden_act='gelu_pytorch_tanh'"):
        check_model_supported(LlamaConfig(hidden_act="gelu_pytorch_tanh"))


def test_multimodal_gemma3_is_refused_naming_the_text_model():
    config = Gemma3Config(architectures=["Gemma3ForConditionalGeneration"])
    with pytest.raises(UnsupportedModelError, match="Gemma3ForConditionalGeneration.*Gemma3ForCausalLM"):
        check_model_supported(config)
