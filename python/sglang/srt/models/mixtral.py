"""Mixtral (8x7B / 8x22B): Llama attention (its sliding_window honoured as Mistral's), every layer a sparse MoE
block of `num_local_experts` experts, softmax top-k renormalised (transformers' MixtralTopKRouter).

Checkpoints name the block `block_sparse_moe` and the experts' projections w1 (gate), w3 (up), w2 (down); they
are read under the names the Qwen-MoE loader knows (`mlp`, gate_proj / up_proj / down_proj)."""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Optional, Tuple

import torch
from transformers import PretrainedConfig

from sglang.srt.models.llama import LlamaModel
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
from sglang.srt.models.sparse_moe import SparseMoeDecoderLayer, SparseMoeShape

_EXPERT_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT_NAME = re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.")


def hf_name(name: str) -> str:
    """A Mixtral checkpoint name under the names our modules load (experts: Qwen-MoE's)."""
    name = _EXPERT_NAME.sub(lambda m: f".mlp.experts.{m.group(1)}.{_EXPERT_PROJ[m.group(2)]}.", name)
    return name.replace(".block_sparse_moe.gate.", ".mlp.gate.")


def renamed(weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        yield hf_name(name), tensor


class MixtralDecoderLayer(SparseMoeDecoderLayer):
    @staticmethod
    def moe_shape(config: PretrainedConfig, layer_id: int) -> Optional[SparseMoeShape]:
        return SparseMoeShape(
            hidden_size=config.hidden_size,
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            expert_intermediate_size=config.intermediate_size,
            renormalize=True,
        )


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(Qwen3MoeForCausalLM):
    model_cls = MixtralModel

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        return super().load_weights(renamed(weights))

    kt_checkpoint_names = staticmethod(renamed)  # --kt-weight-path is a Mixtral-named checkpoint too
    checkpoint_name = staticmethod(hf_name)  # the FP8 loader's view of which experts' parameter a tensor fills


EntryClass = MixtralForCausalLM
