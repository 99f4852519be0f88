"""Tiny pack-quantized INT4 checkpoints for tests, as Kimi-K2-Thinking ships its routed experts: a transformers-written
model whose routed experts' weights are quantized to symmetric int4 in groups of `group` inputs (bf16 scales) and
written in compressed-tensors' pack-quantized layout (``weight_packed`` int32 [out, ceil(in/8)], eight codes q + 8 a
word, code i in bits 4i..4i+3; ``weight_scale``; ``weight_shape``); every other tensor as it was. Written with its
reference: the same model holding the dequantized weights, full precision, no quantization_config.

    d = write_int4_experts_checkpoint(moe_bf16(tmp + "/bf16"), tmp + "/int4", group=32)   # + tmp/int4-dequantized
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional

import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import save_with_reference

# Routed experts under either naming: mlp.experts.N.{gate,up,down}_proj, Mixtral's block_sparse_moe.experts.N.w{1,2,3}.
ROUTED_EXPERT = re.compile(r".*\.(mlp|block_sparse_moe)\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
# Every decoder linear of a dense model (llm-compressor's W4A16 recipe quantizes all but lm_head).
DECODER_LINEAR = re.compile(r".*\.(q|k|v|o|gate|up|down)_proj\.weight$")


def pack_int4_words(codes: torch.Tensor) -> torch.Tensor:
    """int codes in [-8, 7], [rows, cols] -> int32 [rows, ceil(cols/8)]: code 8j + i of a row, plus 8, in bits
    4i..4i+3 of word j (compressed-tensors' pack_to_int32 for 4 bits), zero-padded past cols."""
    rows, cols = codes.shape
    words = -(-cols // 8)
    unsigned = torch.zeros(rows, words * 8, dtype=torch.int64)
    unsigned[:, :cols] = codes.to(torch.int64) + 8
    packed = torch.zeros(rows, words, dtype=torch.int64)
    for i in range(8):
        packed |= unsigned[:, i::8] << (4 * i)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 codes [rows, cols] and bf16 scales [rows, ceil(cols/group)] with w ~= codes x scale."""
    rows, cols = w.shape
    groups = -(-cols // group)
    padded = torch.nn.functional.pad(w.float(), (0, groups * group - cols)).view(rows, groups, group)
    scale = (padded.abs().amax(dim=-1) / 7).clamp(min=1e-8).to(torch.bfloat16)
    codes = torch.round(padded / scale.float()[..., None]).clamp(-8, 7).view(rows, -1)[:, :cols]
    return codes.to(torch.int8), scale


def dequantize_int4_reference(codes: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    cols = codes.shape[1]
    return codes.float() * scale.float().repeat_interleave(group, dim=1)[:, :cols]


KIMI_IGNORE = [
    "lm_head",
    "re:.*self_attn.*",
    "re:.*shared_expert.*",
    r"re:.*mlp\.(gate|up|down)_proj.*",
    r"re:.*mlp\.gate$",
]


def quantization_config(group: int, ignore: Optional[list[str]] = None) -> dict:
    """Kimi-K2-Thinking's quantization_config, its group size replaced: only the routed experts are quantized (or
    every Linear but the modules `ignore` names)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "strategy": "group",
                    "group_size": group,
                    "symmetric": True,
                    "dynamic": False,
                    "actorder": None,
                },
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": KIMI_IGNORE if ignore is None else ignore,
        "kv_cache_scheme": None,
        "quantization_status": "compressed",
    }


def write_int4_experts_checkpoint(
    full_dir: str,
    out_dir: str,
    group: int = 32,
    quantized: re.Pattern = ROUTED_EXPERT,
    ignore: Optional[list[str]] = None,
) -> str:
    """The checkpoint in `full_dir` with its routed experts (or the weights `quantized` matches) pack-quantized in
    `out_dir`, its config's ignore list Kimi's (or `ignore`); `out_dir`-dequantized holds the reference (each such
    weight replaced by its dequantized value, full precision)."""
    state = load_file(os.path.join(full_dir, "model.safetensors"))
    with open(os.path.join(full_dir, "config.json")) as f:
        config = json.load(f)
    packed, reference = {}, {}
    for name, t in state.items():
        if quantized.match(name):
            codes, scale = quantize_int4(t, group)
            base = name[: -len(".weight")]
            packed[base + ".weight_packed"] = pack_int4_words(codes)
            packed[base + ".weight_scale"] = scale
            packed[base + ".weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int32)
            reference[name] = dequantize_int4_reference(codes, scale, group)
        else:
            packed[name], reference[name] = t, t.float()
    assert len(packed) > len(state), f"no weight of {full_dir} matches {quantized.pattern}"
    return save_with_reference(out_dir, config, quantization_config(group, ignore), packed, reference)
