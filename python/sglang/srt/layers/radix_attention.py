"""The attention layer models call: holds the layer's head geometry and defers to the batch's backend."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.layers.quantization.block_fp8_activation import Activation, ActivationLayout


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        v_head_dim: int = -1,
        logit_cap: float = 0.0,
        prefix: str = "",
        sliding_window_size: int = -1,
    ) -> None:
        """`sliding_window_size` > 0: each query attends only to the last that many keys, itself included
        (transformers' Mistral window); -1: the whole context. Every backend honours it."""
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.qk_head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim == -1 else v_head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.logit_cap = logit_cap
        self.sliding_window_size = sliding_window_size
        # The checkpoint's per-tensor KV cache scales (k_scale / v_scale), set after loading when the KV cache
        # is fp8 (model_loader/kv_scales.py): K/V are stored as value / scale and read back times the scale.
        # None: stored as they are (scale 1).
        self.k_scale: Optional[float] = None
        self.v_scale: Optional[float] = None

    def set_kv_scales(self, k_scale: float, v_scale: float) -> None:
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        forward_batch,
        save_kv_cache: bool = True,
        quantize: Optional[ActivationLayout] = None,
    ) -> Activation:
        """``quantize``: the output handed to a block-fp8 o_proj quantized in that layout (AttentionBackend.forward)."""
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache, quantize)
