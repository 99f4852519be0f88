"""Triton attention kernels over the token-major paged KV pool (decode and extend)."""

from sglang.srt.layers.attention.triton_ops.decode_attention import (
    MIN_BLOCK_TOKENS,
    DecodeKernelConfig,
    decode_attention_fwd,
    decode_split_bounds,
    get_num_kv_splits,
)
from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd

__all__ = [
    "MIN_BLOCK_TOKENS",
    "DecodeKernelConfig",
    "decode_attention_fwd",
    "decode_split_bounds",
    "extend_attention_fwd",
    "get_num_kv_splits",
]
