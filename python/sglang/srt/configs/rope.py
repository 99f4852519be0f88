"""Facts about a config's rotary embedding that start-up decisions need (model_config) and the rotary layer
reads (layers/rotary_embedding.py): the rope parameters in transformers 5's form, which rope types run
exactly, and the context a longrope model is run to."""

from __future__ import annotations

from typing import Optional

from transformers import PretrainedConfig

# Rope types whose cos/sin tables, precomputed once per position, are what transformers computes at every
# position we serve (the context never passes max_position_embeddings):
# - default, linear, yarn, llama3: fixed frequencies;
# - dynamic: its frequencies change only past max_position_embeddings;
# - longrope: its short factors up to original_max_position_embeddings, the context it is capped at
#   (transformers switches every position, cached ones included, to the long factors past it).
EXACT_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def rope_parameters(config: PretrainedConfig, layer_type: Optional[str] = None) -> dict:
    """The rope parameters as transformers 5 standardises them (rope_type, rope_theta, scaling fields); given
    `layer_type`, those of that kind of layer (configs whose `rope_parameters` are keyed by layer type: Gemma 3's
    sliding and full attention layers)."""
    params = getattr(config, "rope_parameters", None)
    if layer_type is not None:
        return dict(params[layer_type])
    if params:
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    scaling.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return scaling


def longrope_context_limit(config: PretrainedConfig) -> Optional[int]:
    """original_max_position_embeddings for a longrope config (the longest sequence we run exactly), else None."""
    params = rope_parameters(config)
    if params.get("rope_type") != "longrope":
        return None
    return params.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
