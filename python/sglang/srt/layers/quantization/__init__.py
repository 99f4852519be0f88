"""Weight quantization methods. ``get_moe_method(name)`` builds the method for a fused-MoE layer."""

from __future__ import annotations

from typing import Callable

from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase
from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod
from sglang.srt.layers.quantization.int4 import Int4FusedMoEMethod
from sglang.srt.layers.quantization.int8 import Int8FusedMoEMethod
from sglang.srt.layers.quantization.mxfp4 import Mxfp4FusedMoEMethod
from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

MOE_METHODS: dict[str, Callable[[], FusedMoEMethodBase]] = {
    "BF16": UnquantizedFusedMoEMethod,
    "FP8": Fp8FusedMoEMethod,
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


def get_moe_method(name: str) -> FusedMoEMethodBase:
    """A fresh method instance for ``name`` (case-insensitive, aliases accepted)."""
    key = name.strip().upper()
    key = MOE_METHOD_ALIASES.get(key, key)
    if key not in MOE_METHODS:
        valid = ", ".join([*MOE_METHODS, *MOE_METHOD_ALIASES])
        raise ValueError(f"unknown MoE quantization method {name!r}; valid names: {valid}")
    return MOE_METHODS[key]()


__all__ = [
    "FusedMoEMethodBase",
    "MOE_METHODS",
    "MOE_METHOD_ALIASES",
    "get_moe_method",
]
