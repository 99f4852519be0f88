"""Facts about Gemma 2 and Gemma 3 (text) configs: what models/gemma2.py and models/gemma3.py run, as transformers'
modeling_gemma2.py / modeling_gemma3.py (5.24) compute it, and the start-up refusal, naming the field, of the rest.

What we run: the GeGLU MLP with torch's tanh-approximated gelu (`hidden_activation` gelu_pytorch_tanh), causal
attention scaled by `query_pre_attn_scalar`^-0.5, sliding-window layers from `layer_types` / `sliding_window`,
`attn_logit_softcapping` in the attention kernels (Gemma 2 only: transformers' Gemma 3 attention never passes it on,
so a Gemma 3 config that sets it is refused rather than guessed), `final_logit_softcapping` on the logits, and rope
whose frequencies are fixed at start-up (per layer type for Gemma 3: `rope_local_base_freq` for the sliding layers,
the global layers' scaling).
"""

from __future__ import annotations

from typing import Dict

from transformers import PretrainedConfig

from sglang.srt.configs.deepseek import UnsupportedModelError
from sglang.srt.configs.sliding_window import layer_sliding_windows

GEMMA2_MODEL_TYPE = "gemma2"
GEMMA3_TEXT_MODEL_TYPE = "gemma3_text"
GEMMA_MODEL_TYPES = (GEMMA2_MODEL_TYPE, GEMMA3_TEXT_MODEL_TYPE)
GEMMA3_MULTIMODAL_MODEL_TYPE = "gemma3"
GEMMA3_MULTIMODAL_ARCH = "Gemma3ForConditionalGeneration"
# The MLP activations the Gemma classes implement (activation.gelu_tanh_and_mul).
GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh",)
# Rope types whose frequencies transformers fixes at start-up, as our precomputed cos/sin tables are; "dynamic"
# and "longrope" change them with the sequence length.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def is_gemma(config: PretrainedConfig) -> bool:
    """A Gemma 2 or Gemma 3 text config (what models/gemma2.py and models/gemma3.py serve)."""
    return getattr(config, "model_type", None) in GEMMA_MODEL_TYPES


def rope_types(config: PretrainedConfig) -> Dict[str, str]:
    """The rope type of each rope parameter set, by its field name: Gemma 3 keys them by layer type."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if config.model_type == GEMMA3_TEXT_MODEL_TYPE:
        return {
            f"rope_parameters[{kind!r}]['rope_type']": params[kind].get("rope_type", "default")
            for kind in sorted(set(config.layer_types))
        }
    return {"rope_parameters['rope_type']": params.get("rope_type", "default")}


def check_gemma_config(config: PretrainedConfig) -> None:
    """Raise UnsupportedModelError naming the first field of a Gemma config we do not run exactly (a top-level
    config: the multimodal Gemma 3 is recognised by its own model_type / architecture)."""
    model_type = getattr(config, "model_type", None)
    archs = getattr(config, "architectures", None) or []
    if model_type == GEMMA3_MULTIMODAL_MODEL_TYPE or GEMMA3_MULTIMODAL_ARCH in archs:
        raise UnsupportedModelError(
            f"{GEMMA3_MULTIMODAL_ARCH} (Gemma 3 with its vision tower, model_type {GEMMA3_MULTIMODAL_MODEL_TYPE!r}) "
            f"is not supported: only the text model, Gemma3ForCausalLM (model_type {GEMMA3_TEXT_MODEL_TYPE!r}), is"
        )
    if model_type not in GEMMA_MODEL_TYPES:
        return
    act = getattr(config, "hidden_activation", None)
    if act not in GEMMA_ACTIVATIONS:
        raise UnsupportedModelError(
            f"hidden_activation={act!r} is not supported for {model_type} (supported: {', '.join(GEMMA_ACTIVATIONS)})"
        )
    if getattr(config, "use_bidirectional_attention", None):
        raise UnsupportedModelError("use_bidirectional_attention=True is not supported (causal attention only)")
    cap = getattr(config, "attn_logit_softcapping", None)
    if model_type == GEMMA3_TEXT_MODEL_TYPE and cap is not None:
        raise UnsupportedModelError(
            f"attn_logit_softcapping={cap!r} is not supported for {model_type}: transformers' Gemma 3 attention "
            "does not apply it, so what the checkpoint expects is unknown"
        )
    for field, rope_type in rope_types(config).items():
        if rope_type not in STATIC_ROPE_TYPES:
            raise UnsupportedModelError(
                f"{field}={rope_type!r} is not supported for {model_type} (supported: {', '.join(STATIC_ROPE_TYPES)})"
            )
    try:
        layer_sliding_windows(config)
    except ValueError as e:
        raise UnsupportedModelError(str(e)) from e
