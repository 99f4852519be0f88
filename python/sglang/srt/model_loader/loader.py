"""get_model: build the model on its device and fill it from HF safetensors, GGUF, or dummy weights."""

from __future__ import annotations

import logging
from typing import Iterator, Optional, Tuple

import torch
from torch import nn

from sglang.srt.configs.kt_config import KTConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import store_weights_column_major
from sglang.srt.model_loader.kv_scales import KVScaleCollector, apply_kv_scales
from sglang.srt.models.registry import get_model_class

logger = logging.getLogger(__name__)


def _weights(model_config: ModelConfig, load_format: str, device: str, seed: int) -> Iterator[Tuple[str, torch.Tensor]]:
    if load_format == "dummy":
        from sglang.srt.model_loader.dummy_weights import dummy_weights_iterator

        return dummy_weights_iterator(model_config.hf_config, model_config.dtype, device, seed)
    source = model_config.source
    if source.kind == "gguf":
        from sglang.srt.model_loader.gguf_loader import gguf_weights_iterator

        return gguf_weights_iterator(source.path)
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    return safetensors_weights_iterator(source.path)


def build_model(model_config: ModelConfig, kt: Optional[KTConfig] = None) -> nn.Module:
    """The model class for the architecture, built from the records it needs on the current default device
    (empty: the weights come after). MoE models take the KT settings; dense ones the linear layers' format."""
    cls = get_model_class(model_config.architecture)
    kwargs = {"kt": kt} if model_config.is_moe else {}
    if model_config.quantization is not None:
        kwargs["quantization"] = model_config.quantization
    return cls(model_config.hf_config, model_config.dtype, max_position=model_config.context_len, **kwargs)


def get_model(
    model_config: ModelConfig, load_format: str, device: str, kt: Optional[KTConfig] = None, seed: int = 0
) -> nn.Module:
    with torch.device(device):
        model = build_model(model_config, kt)
    kv_scales = KVScaleCollector()  # the checkpoint's k_scale/v_scale: not weights, given to the attention layers
    weights = kv_scales.weights(_weights(model_config, load_format, device, seed))
    quant = model_config.checkpoint_quantization
    if quant is not None:  # a native FP8 / INT4 checkpoint: layers of its format take it as it is, others dequantized
        from sglang.srt.model_loader.fp8_checkpoint import (
            checkpoint_fp8_weights,
            checkpoint_parameter_filter,
            quantized_dummy_weights,
        )
        from sglang.srt.model_loader.int4_checkpoint import checkpoint_int4_weights, quantized_int4_dummy_weights

        keep = checkpoint_parameter_filter(model, model.stacked_params_mapping, quant)
        if load_format == "dummy":
            dummy = quantized_int4_dummy_weights if quant.is_int4 else quantized_dummy_weights
            weights = dummy(weights, quant, keep)
        elif quant.is_int4:
            weights = checkpoint_int4_weights(weights, quant, model_config.dtype, keep)
        else:
            weights = checkpoint_fp8_weights(weights, quant, model_config.dtype, keep)
    model.load_weights(weights)
    apply_kv_scales(model, kv_scales.scales, model_config.kv_cache_dtype, model_config.attention == "mla")
    model.finish_loading()
    if device == "cpu":
        store_weights_column_major(model)  # the CPU GEMM's faster layout at decode's few rows (linear.py)
    return model.eval()
