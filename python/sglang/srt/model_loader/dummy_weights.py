"""Random weights of a model's real checkpoint shapes, seeded, generated on the target device.

The tensors are produced in checkpoint naming and go through the model's own weight loaders, so a
model sharded over N ranks gets exactly the slices of the weights a single rank would hold.
"""

from __future__ import annotations

import re
import zlib
from typing import Dict, Iterator, Tuple

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

_FUSED_EXPERTS = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")


def checkpoint_shapes(config: PretrainedConfig) -> Dict[str, Tuple[int, ...]]:
    """Names and shapes of the checkpoint tensors, from the reference model built on the meta device."""
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(config)
    shapes: Dict[str, Tuple[int, ...]] = {}
    for name, t in ref.state_dict().items():
        m = _FUSED_EXPERTS.match(name)
        if m is None:
            shapes[name] = tuple(t.shape)
            continue
        # transformers keeps experts fused in memory; checkpoints store one tensor per expert.
        prefix, kind = m.groups()
        num_experts = t.shape[0]
        for e in range(num_experts):
            if kind == "gate_up_proj":
                half = t.shape[1] // 2
                shapes[f"{prefix}.{e}.gate_proj.weight"] = (half, t.shape[2])
                shapes[f"{prefix}.{e}.up_proj.weight"] = (half, t.shape[2])
            else:
                shapes[f"{prefix}.{e}.down_proj.weight"] = (t.shape[1], t.shape[2])
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    return shapes


def dummy_weights_iterator(
    config: PretrainedConfig, dtype: torch.dtype, device: str, seed: int = 0, std: float = 0.02
) -> Iterator[Tuple[str, torch.Tensor]]:
    gen = torch.Generator(device=device)
    for name, shape in checkpoint_shapes(config).items():
        if len(shape) == 1 and "norm" in name:
            yield name, torch.ones(shape, dtype=dtype, device=device)
            continue
        gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        yield name, torch.randn(shape, generator=gen, dtype=torch.float32, device=device).mul_(std).to(dtype)
