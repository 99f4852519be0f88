"""Native FP8 checkpoints read tensor by tensor (configs/quantization_config.py says which layout).

Each quantized linear's ``X.weight`` is float8_e4m3fn and comes with its scale ``X.weight_scale_inv`` (block
fp8: fp32 [ceil(out/128), ceil(in/128)]) or ``X.weight_scale`` (compressed-tensors: [out, 1] per channel, one
value per tensor), weight = q x scale. A weight whose target parameter keeps fp8 (``keep_fp8``: the GPU's dense
linear layers) passes through with its scale; every other one (the CPU, layers held in full precision) is
dequantized here, once, into the model's dtype, so the layers never see the checkpoint's format. Static
activation scales (``input_scale``) are not weights: activations are quantized per token where fp8 is kept.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Iterable, Iterator, Tuple

import torch

from sglang.srt.configs.quantization_config import BLOCK, CheckpointQuantization

FP8_DTYPES = (torch.float8_e4m3fn,)
# "model.layers.3.mlp.experts.17.gate_proj.weight" -> "model.layers.3.mlp.experts" (a FusedMoE or a KT wrapper).
_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.(gate_proj|up_proj|down_proj)\.weight$")


def dequantize_fp8(qweight: torch.Tensor, scale: torch.Tensor, strategy: str, dtype: torch.dtype) -> torch.Tensor:
    """q [N, K] e4m3 and its scale -> q x scale in ``dtype`` (computed in fp32)."""
    rows, cols = qweight.shape
    s = scale.float()
    if strategy == "block":
        expected = (-(-rows // BLOCK), -(-cols // BLOCK))
        if tuple(s.shape) != expected:
            raise ValueError(
                f"block scale of shape {tuple(s.shape)} for a [{rows}, {cols}] weight: expected {expected}"
            )
        s = s.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    elif strategy == "channel":
        if s.numel() != rows:
            raise ValueError(f"per-channel scale of {s.numel()} values for a weight of {rows} rows")
        s = s.reshape(rows, 1)
    elif s.numel() != 1:
        raise ValueError(f"per-tensor scale of {s.numel()} values")
    return (qweight.float() * s.reshape(s.shape if strategy != "tensor" else ())).to(dtype)


def checkpoint_fp8_weights(
    weights: Iterable[Tuple[str, torch.Tensor]],
    quant: CheckpointQuantization,
    dtype: torch.dtype,
    keep_fp8: Callable[[str], bool] = lambda name: False,
) -> Iterator[Tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with fp8 weights dequantized into ``dtype`` (pairing each with its scale,
    whichever comes first), except those ``keep_fp8(weight name)`` keeps, which pass with their scales.
    Raises where a weight has no scale or a scale no weight (a layout the config did not describe)."""
    scale_suffix = "." + quant.scale_name
    kept_suffix = "." + quant.param_scale_name  # the scale's name on our layers
    pending_q: Dict[str, torch.Tensor] = {}
    pending_s: Dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(".input_scale"):
            continue
        if name.endswith(scale_suffix):
            base = name[: -len(scale_suffix)]
            if keep_fp8(base + ".weight"):
                yield base + kept_suffix, tensor
            elif base in pending_q:
                yield base + ".weight", dequantize_fp8(pending_q.pop(base), tensor, quant.strategy, dtype)
            else:
                pending_s[base] = tensor
            continue
        if name.endswith(".weight") and tensor.dtype in FP8_DTYPES:
            base = name[: -len(".weight")]
            if keep_fp8(name):
                yield name, tensor
            elif base in pending_s:
                yield name, dequantize_fp8(tensor, pending_s.pop(base), quant.strategy, dtype)
            else:
                pending_q[base] = tensor
            continue
        yield name, tensor
    if pending_q or pending_s:
        raise ValueError(
            f"{quant.method} checkpoint: fp8 weights without a {quant.scale_name}: {sorted(pending_q)[:4]}; "
            f"{quant.scale_name} without an fp8 weight: {sorted(pending_s)[:4]}"
        )


def checkpoint_parameter_filter(
    model: torch.nn.Module, stacked_params_mapping, quant: CheckpointQuantization
) -> Callable[[str], bool]:
    """keep for `model`: whether a checkpoint weight's target holds the checkpoint's format as it is (a linear
    parameter stored in fp8, through the model's stacked projections, q_proj -> qkv_proj ...; routed experts whose
    format holds that layout: FP8 blocks, FP8_PERCHANNEL rows, INT4 groups), i.e. the layer runs it."""
    fp8 = {name for name, p in model.named_parameters() if p.dtype in FP8_DTYPES}
    modules = dict(model.named_modules())

    def keep(checkpoint_name: str) -> bool:
        name = model.checkpoint_name(checkpoint_name)  # as the model's loader will name it (Mixtral's experts)
        m = _EXPERT.match(name)
        if m is not None:  # an expert's matrix: kept where the experts' format holds the checkpoint's layout
            # A layer the model does not build (DeepSeek-V3's multi-token-prediction layer, dropped by the model's
            # loader) has no experts module: its tensors pass dequantized, to be skipped there.
            experts = modules.get(m.group(1))
            return experts is not None and experts.takes_checkpoint_experts(quant)
        for param_suffix, ckpt_suffix, _ in stacked_params_mapping:
            if ckpt_suffix in name:
                return name.replace(ckpt_suffix, param_suffix) in fp8
        return name in fp8

    return keep


def quantized_dummy_weights(
    weights: Iterable[Tuple[str, torch.Tensor]], quant: CheckpointQuantization, keep_fp8: Callable[[str], bool]
) -> Iterator[Tuple[str, torch.Tensor]]:
    """``--load-format dummy`` for an FP8 checkpoint's shapes: the random full-precision weights of the layers
    that keep fp8 are quantized into the checkpoint's format (per 128x128 block, or per row), with scales."""
    from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod
    from sglang.srt.layers.quantization.fp8_linear import quantize_rows

    for name, tensor in weights:
        if not (name.endswith(".weight") and keep_fp8(name)):
            yield name, tensor
            continue
        q, scale = Fp8FusedMoEMethod().quantize(tensor) if quant.strategy == "block" else quantize_rows(tensor)
        yield name, q
        yield name[: -len("weight")] + quant.param_scale_name, scale
