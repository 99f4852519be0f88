"""Pack-quantized INT4 checkpoints (compressed-tensors, W4A16: Kimi-K2-Thinking's and K2.5's routed experts) read
tensor by tensor (configs/quantization_config.py says which layout).

Each quantized linear comes as three tensors: ``X.weight_packed`` int32 [out, ceil(in/8)] holding eight codes
q + 8 a word (code i in bits 4i..4i+3), ``X.weight_scale`` [out, ceil(in/group)] and ``X.weight_shape`` [out, in];
weight = q x scale per group of inputs. On a little-endian machine (x86, ARM as run) the words' bytes are then
two codes each, the first in the low nibble: exactly the INT4 expert format's bytes (layers/quantization/int4.py).
A matrix whose target keeps INT4 of that group (``keep``: routed experts, without KT or under KT with an INT4
--kt-method; layers/quantization.checkpoint_experts_method) passes
as those bytes (``X.weight_packed``, uint8 [out, in/2]) and its fp32 scales (``X.weight_group_scale``); every other
one is dequantized here, once, into the model's dtype.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, Iterable, Iterator, Tuple

import torch

from sglang.srt.configs.quantization_config import CheckpointQuantization
from sglang.srt.layers.quantization.int4 import CHECKPOINT_CODES, CHECKPOINT_GROUP_SCALES, Int4FusedMoEMethod

PARTS = (".weight_packed", ".weight_scale", ".weight_shape")


def int4_code_bytes(packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """weight_packed int32 [rows, ceil(cols/8)] -> uint8 [rows, cols/2]: two codes a byte, the first in the low
    nibble (the words' little-endian bytes; the padding past `cols` dropped)."""
    if sys.byteorder != "little":
        raise ValueError("reading pack-quantized int4 weights needs a little-endian machine")
    if cols % 2:
        raise ValueError(f"a pack-quantized int4 weight of {cols} inputs: an odd width is not supported")
    if packed.dtype != torch.int32 or tuple(packed.shape) != (rows, -(-cols // 8)):
        raise ValueError(f"weight_packed {packed.dtype} {tuple(packed.shape)} for a [{rows}, {cols}] weight")
    return packed.contiguous().view(torch.uint8)[:, : cols // 2].contiguous()


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """Code bytes [rows, cols/2] and scales [rows, ceil(cols/group)] -> q x scale in ``dtype`` (in fp32)."""
    rows, cols = codes.shape[0], codes.shape[1] * 2
    return Int4FusedMoEMethod(group).dequantize(codes, scale.float(), rows, cols, dtype)


def checkpoint_int4_weights(
    weights: Iterable[Tuple[str, torch.Tensor]],
    quant: CheckpointQuantization,
    dtype: torch.dtype,
    keep: Callable[[str], bool],
) -> Iterator[Tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each packed int4 weight (its three parts, in any order) either kept as code
    bytes and fp32 group scales (``keep(weight name)``) or dequantized into ``dtype``. Raises where a weight's
    parts are incomplete or their shapes disagree."""
    group = quant.group_size
    assert group is not None
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        suffix = next((s for s in PARTS if name.endswith(s)), None)
        if suffix is None:
            yield name, tensor
            continue
        base = name[: -len(suffix)]
        parts = pending.setdefault(base, {})
        parts[suffix] = tensor
        if len(parts) < len(PARTS):
            continue
        del pending[base]
        rows, cols = (int(v) for v in parts[".weight_shape"].tolist())
        codes = int4_code_bytes(parts[".weight_packed"], rows, cols)
        scale = parts[".weight_scale"].float()
        if tuple(scale.shape) != (rows, -(-cols // group)):
            raise ValueError(
                f"{base}.weight_scale of shape {tuple(scale.shape)} for a [{rows}, {cols}] weight in groups of {group}"
            )
        if keep(base + ".weight"):
            yield f"{base}.{CHECKPOINT_CODES}", codes
            yield f"{base}.{CHECKPOINT_GROUP_SCALES}", scale
        else:
            yield base + ".weight", dequantize_int4(codes, scale, group, dtype)
    if pending:
        missing = {base: [s for s in PARTS if s not in parts] for base, parts in list(pending.items())[:4]}
        raise ValueError(f"pack-quantized checkpoint: int4 weights with parts missing: {missing}")


def quantized_int4_dummy_weights(
    weights: Iterable[Tuple[str, torch.Tensor]], quant: CheckpointQuantization, keep: Callable[[str], bool]
) -> Iterator[Tuple[str, torch.Tensor]]:
    """``--load-format dummy`` for a pack-quantized checkpoint's shapes: the random weights of the matrices kept in
    INT4 are quantized into the checkpoint's groups (code bytes and scales); the rest stay as they are."""
    method = Int4FusedMoEMethod(quant.group_size)
    for name, tensor in weights:
        if not (name.endswith(".weight") and keep(name)):
            yield name, tensor
            continue
        codes, scale = method.quantize(tensor.float())
        base = name[: -len(".weight")]
        yield f"{base}.{CHECKPOINT_CODES}", codes
        yield f"{base}.{CHECKPOINT_GROUP_SCALES}", scale
