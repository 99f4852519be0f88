"""KV cache scales a checkpoint ships beside its weights, one per attention layer and tensor.

FP8 checkpoints calibrated for an fp8 KV cache (llm-compressor / compressed-tensors with a ``kv_cache_scheme``,
ModelOpt, vLLM's fp8 exports) carry ``model.layers.N.self_attn.k_scale`` and ``.v_scale``: K is stored as
k / k_scale and read back times k_scale, so the layer's largest K lands near e4m3's largest value instead of
spending the format's range on values the layer never has. Older exports name them
``self_attn.k_proj.output_scale`` / ``v_proj.output_scale`` or one ``self_attn.kv_scale`` for both.

They are not weights: ``KVScaleCollector.weights`` takes them out of the checkpoint's stream and
``apply_kv_scales`` hands them to the attention layers once every weight is loaded. With an fp8 KV cache the
layers use them (mem_cache/memory_pool.py stores with them, the attention backends read with them); with any
other KV dtype they are ignored, with one log line (upstream does the same).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Dict, Iterable, Iterator, Tuple

import torch
from torch import nn

from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import FP8_KV_DTYPES

logger = logging.getLogger(__name__)

# "<attention module>.k_scale" -> (attention module, which); "kv" means one scale for both.
_SCALE_NAME = re.compile(r"^(?P<attn>.+\.self_attn)\.(?:(?P<which>k|v|kv)_scale|(?P<proj>k|v)_proj\.output_scale)$")


def kv_scale_target(name: str) -> Tuple[str, str] | None:
    """(attention module name, "k" | "v" | "kv") for a KV cache scale tensor's name; None for anything else."""
    m = _SCALE_NAME.match(name)
    if m is None:
        return None
    return m.group("attn"), m.group("which") or m.group("proj")


def _per_tensor_value(name: str, tensor: torch.Tensor) -> float:
    if tensor.numel() != 1:
        raise ValueError(
            f"{name}: a KV cache scale of shape {tuple(tensor.shape)}; only one scale per layer and tensor "
            "(per-tensor) is supported"
        )
    value = float(tensor.float().reshape(()))
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: KV cache scale {value} is not a positive finite number")
    return value


class KVScaleCollector:
    """Takes the KV cache scales out of a checkpoint's tensor stream (``weights``) and keeps them by
    attention module: ``scales[module] = {"k": value, "v": value}``."""

    def __init__(self) -> None:
        self.scales: Dict[str, Dict[str, float]] = {}

    def weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            target = kv_scale_target(name)
            if target is None:
                yield name, tensor
                continue
            attn, which = target
            value = _per_tensor_value(name, tensor)
            entry = self.scales.setdefault(attn, {})
            for key in ("k", "v") if which == "kv" else (which,):
                entry[key] = value


def apply_kv_scales(model: nn.Module, scales: Dict[str, Dict[str, float]], kv_dtype: torch.dtype, mla: bool) -> int:
    """Give each attention layer its checkpoint scales when the KV cache is fp8; returns how many layers got
    them (0 when ignored). A layer with only one of the two uses it for both (as upstream)."""
    if not scales:
        return 0
    if kv_dtype not in FP8_KV_DTYPES:
        logger.info(
            "The checkpoint's KV cache scales (k_scale/v_scale, %d attention layers) are ignored: the KV cache "
            "is %s; they apply to --kv-cache-dtype fp8_e4m3",
            len(scales),
            kv_dtype,
        )
        return 0
    if mla:
        raise ValueError(
            f"{next(iter(scales))}.k_scale: KV cache scales for a multi-head latent attention cache are not "
            "supported; serve it with --kv-cache-dtype auto"
        )
    for module_name, entry in scales.items():
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            raise ValueError(f"{module_name}.k_scale/v_scale: the model has no attention module of that name") from None
        layers = [m for m in module.modules() if isinstance(m, RadixAttention)]
        if len(layers) != 1:
            raise ValueError(f"{module_name}.k_scale/v_scale: expected one attention layer there, found {len(layers)}")
        both = max(entry.values())
        layers[0].set_kv_scales(entry.get("k", both), entry.get("v", both))
    logger.info("fp8 KV cache: the checkpoint's k_scale/v_scale used in %d attention layers", len(scales))
    return len(scales)
