"""Embedding and LM head sharded along the vocabulary (padded so every rank holds the same rows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype=None, prefix: str = "") -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.rows_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_partition
        self.vocab_end = min(self.vocab_start + self.rows_per_partition, num_embeddings)
        self.weight = nn.Parameter(
            torch.empty(self.rows_per_partition, embedding_dim, dtype=params_dtype), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.num_embeddings or loaded.shape[1] != param.shape[1]:
            raise ValueError(f"embedding of shape {tuple(loaded.shape)} does not match vocab {self.num_embeddings}")
        rows = self.vocab_end - self.vocab_start
        param.data[:rows].copy_(loaded[self.vocab_start : self.vocab_end])
        param.data[rows:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        in_range = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(in_range, input_ids - self.vocab_start, 0)
        out = F.embedding(local, self.weight) * in_range.unsqueeze(-1).to(self.weight.dtype)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection; LogitsProcessor does the matmul and gathers the vocab shards."""

    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype=None, prefix: str = "") -> None:
        super().__init__(num_embeddings, embedding_dim, params_dtype, prefix)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - misuse guard
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor")
