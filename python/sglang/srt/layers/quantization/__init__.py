"""Weight quantization methods. ``get_moe_method(name)`` builds the method for a fused-MoE layer."""

from __future__ import annotations

import re
from typing import Callable, Optional

from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase
from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod, Fp8PerChannelFusedMoEMethod
from sglang.srt.layers.quantization.int4 import DEFAULT_INT4_GROUP, Int4FusedMoEMethod
from sglang.srt.layers.quantization.int8 import Int8FusedMoEMethod
from sglang.srt.layers.quantization.mxfp4 import Mxfp4FusedMoEMethod
from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

MOE_METHODS: dict[str, Callable[[], FusedMoEMethodBase]] = {
    "BF16": UnquantizedFusedMoEMethod,
    "FP8": Fp8FusedMoEMethod,
    "FP8_PERCHANNEL": Fp8PerChannelFusedMoEMethod,
    "INT8": Int8FusedMoEMethod,
    "INT4": Int4FusedMoEMethod,
    "MXFP4": Mxfp4FusedMoEMethod,
}

# KTransformers' CPU-expert method names, mapped to the format that stores the same information.
MOE_METHOD_ALIASES: dict[str, str] = {
    "AMXINT4": "INT4",
    "AMXINT8": "INT8",
    "RAWINT4": "INT4",
}


# The routed experts' format for a native FP8 checkpoint on the GPU, by its linear layers' format
# (configs/quantization_config.linear_weight_format): its experts held as they are. Any other checkpoint's experts
# arrive in full precision ("BF16": the model's dtype).
CHECKPOINT_EXPERTS_METHODS: dict[str, str] = {"fp8_block": "FP8", "fp8_channel": "FP8_PERCHANNEL"}


def checkpoint_experts_method(linear_format: Optional[str]) -> str:
    return CHECKPOINT_EXPERTS_METHODS.get(linear_format or "", "BF16")


def int4_method_name(group_size: int) -> str:
    """get_moe_method's name for INT4 experts with one scale per `group_size` inputs (a pack-quantized checkpoint's)."""
    return "INT4" if group_size == DEFAULT_INT4_GROUP else f"INT4_G{group_size}"


def get_moe_method(name: str) -> FusedMoEMethodBase:
    """A fresh method instance for ``name`` (case-insensitive, aliases accepted; INT4_G<n>: INT4 in groups of n)."""
    key = name.strip().upper()
    key = MOE_METHOD_ALIASES.get(key, key)
    grouped = re.fullmatch(r"INT4_G([1-9][0-9]*)", key)
    if grouped:
        return Int4FusedMoEMethod(group_size=int(grouped.group(1)))
    if key not in MOE_METHODS:
        valid = ", ".join([*MOE_METHODS, *MOE_METHOD_ALIASES])
        raise ValueError(f"unknown MoE quantization method {name!r}; valid names: {valid}")
    return MOE_METHODS[key]()


__all__ = [
    "CHECKPOINT_EXPERTS_METHODS",
    "checkpoint_experts_method",
    "FusedMoEMethodBase",
    "MOE_METHODS",
    "MOE_METHOD_ALIASES",
    "get_moe_method",
    "int4_method_name",
]
