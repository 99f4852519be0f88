"""Weight quantization methods. ``get_moe_method(name)`` builds the method for a fused-MoE layer."""

from __future__ import annotations

import re
from typing import Callable, Optional

from sglang.srt.configs.quantization_config import CheckpointQuantization, checkpoint_quantization
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
# (configs/quantization_config.linear_weight_format): its experts held as they are.
CHECKPOINT_EXPERTS_METHODS: dict[str, str] = {"fp8_block": "FP8", "fp8_channel": "FP8_PERCHANNEL"}
# Where a MoE layer's first expert projection lives in checkpoints (Mixtral's names apart from the others'): a
# quantization config's ignore list names the experts so when it leaves them in full precision.
EXPERT_CHECKPOINT_NAMES = ("{layer}.mlp.experts.0.gate_proj", "{layer}.block_sparse_moe.experts.0.w1")


def checkpoint_experts_method(
    linear_format: Optional[str], checkpoint: Optional[CheckpointQuantization], layer_prefix: str
) -> str:
    """The routed experts' format without KT: the checkpoint's own, held as it is. A pack-quantized INT4 checkpoint's
    experts in its groups (INT4_G<size>, on either device: the fused MoE reads the codes on the GPU, the CPU
    dequantizes the experts a step touches), unless its config leaves the experts of `layer_prefix` ("model.layers.3")
    in full precision; a native FP8 checkpoint's on the GPU by its linear format; else full precision ("BF16": the
    model's dtype)."""
    if checkpoint is not None and checkpoint.is_int4:
        names = (pattern.format(layer=layer_prefix) for pattern in EXPERT_CHECKPOINT_NAMES)
        if not any(checkpoint.is_ignored(name) for name in names):
            assert checkpoint.group_size is not None
            return int4_method_name(checkpoint.group_size)
    return CHECKPOINT_EXPERTS_METHODS.get(linear_format or "", "BF16")


def layer_experts_method(linear_format: Optional[str], config, layer_id: int) -> str:
    """checkpoint_experts_method for MoE layer `layer_id` of a model whose (transformers) `config` declares the
    checkpoint's quantization: what every MoE family's layer builds its routed experts in without KT."""
    return checkpoint_experts_method(linear_format, checkpoint_quantization(config), f"model.layers.{layer_id}")


def checkpoint_fp8_holder(strategy: str) -> str:
    """The expert format that holds a native FP8 checkpoint's experts of that scale layout as they are ("block":
    FP8, "channel" / "tensor": FP8_PERCHANNEL), found by asking each format."""
    return next(name for name, make in MOE_METHODS.items() if make().holds_checkpoint_fp8(strategy))


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
    "EXPERT_CHECKPOINT_NAMES",
    "checkpoint_experts_method",
    "checkpoint_fp8_holder",
    "layer_experts_method",
    "FusedMoEMethodBase",
    "MOE_METHODS",
    "MOE_METHOD_ALIASES",
    "get_moe_method",
    "int4_method_name",
]
