"""Helpers the model files share."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import FusedSetKVBufferArg


def create_fused_set_kv_buffer_arg(
    key: torch.Tensor, value: torch.Tensor, layer: RadixAttention, forward_batch
) -> Optional[FusedSetKVBufferArg]:
    """Let rotary write this step's K/V into the pool (one kernel) when the pool allows it, else None.

    ``key``/``value`` are [T, H * D] (views of the qkv output are fine). None means: rotate, then
    let attention store K/V as usual (``save_kv_cache=True``)."""
    pool = forward_batch.token_to_kv_pool
    if not value.is_cuda or not hasattr(pool, "fused_store_buffers"):
        return None
    n = key.shape[0]
    k = key.view(n, layer.tp_k_head_num, layer.qk_head_dim)
    v = value.view(n, layer.tp_v_head_num, layer.v_head_dim)
    buffers = pool.fused_store_buffers(layer.layer_id, k, v)
    if buffers is None:
        return None
    return FusedSetKVBufferArg(
        value=value, k_buffer=buffers[0], v_buffer=buffers[1], cache_loc=forward_batch.out_cache_loc
    )


def create_fused_latent_store_arg(
    latent: torch.Tensor, k_rope: torch.Tensor, layer_id: int, forward_batch, latent_norm: RMSNorm
) -> Optional[FusedSetKVBufferArg]:
    """MLA's counterpart: let rotary norm this step's latent rows (``latent`` [T, kv_lora] as V, normed in place by
    ``latent_norm``) and write them with the rotated ``k_rope`` [T, rope] (as K) into the latent pool, when the pool
    allows it; else None (the caller norms the latent, attention stores the rows: ``save_kv_cache=True``). Two
    launches less a layer on the GPU; on the CPU rotary's torch path does the same norm and stores (one path)."""
    buffers = forward_batch.token_to_kv_pool.fused_store_buffers(layer_id, k_rope, latent)
    if buffers is None:
        return None
    return FusedSetKVBufferArg(
        value=latent,
        k_buffer=buffers[0],
        v_buffer=buffers[1],
        cache_loc=forward_batch.out_cache_loc,
        value_norm=(latent_norm.weight, latent_norm.variance_epsilon),
    )
