"""The attention layer MLA models call (RadixAttention's counterpart for a latent KV cache): holds the
layer's geometry and defers to the batch's backend, whose `forward_mla` stores the rows and attends."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.layers.attention.triton_ops.head_matmul import HeadMatmul


class MLAAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        kv_lora_rank: int,
        scaling: float,
        layer_id: int,
    ) -> None:
        """`num_heads`: this rank's query heads; `scaling`: the softmax scale (DeepSeek's YaRN correction in it)."""
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        w_kv_b: torch.Tensor,
        forward_batch,
        save_kv_cache: bool = True,
        q_latent: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """q_nope [T, H, nope], q_rope [T, H, rope] (rotated), latent [T, kv_lora] (normed c_kv), k_rope [T, rope]
        (rotated), w_kv_b: kv_b_proj's weight on this rank [H * (nope + v), kv_lora] -> [T, H * v].
        `save_kv_cache` False: the rows are in the pool already (rotary stored them). `q_latent`: q_nope through
        W_UK already, as `query_absorb` asked (rotary computed it)."""
        backend = forward_batch.attn_backend
        return backend.forward_mla(
            q_nope, q_rope, latent, k_rope, w_kv_b, self, forward_batch, save_kv_cache, q_latent=q_latent
        )

    def query_absorb(self, q_nope: torch.Tensor, w_kv_b: torch.Tensor, forward_batch) -> Optional[HeadMatmul]:
        """The query's W_UK product for the kernel before attention to compute (rotary's), where this batch's
        backend takes it (see its `mla_query_absorb`); None: attention computes it."""
        return forward_batch.attn_backend.mla_query_absorb(q_nope, w_kv_b, self, forward_batch)
