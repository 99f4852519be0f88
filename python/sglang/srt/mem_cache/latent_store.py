"""MLA's latent rows written into MLATokenToKVPool's buffer in one triton kernel (the pool's GPU path for a decode
layer's rows; a torch cat and an index_put were two launches)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.pdl import pdl_available, pdl_prologue


@triton.jit
def _store_latent_rows(
    cache,
    loc,
    latent,
    k_rope,
    stride_c,
    stride_lat,
    stride_kr,
    KV_LORA: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_LORA: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    t = tl.program_id(0)
    row = cache + tl.load(loc + t).to(tl.int64) * stride_c
    c = tl.arange(0, BLOCK_LORA)
    tl.store(row + c, tl.load(latent + t * stride_lat + c, mask=c < KV_LORA), mask=c < KV_LORA)
    r = tl.arange(0, BLOCK_ROPE)
    tl.store(row + KV_LORA + r, tl.load(k_rope + t * stride_kr + r, mask=r < ROPE), mask=r < ROPE)


def store_latent_rows(cache: torch.Tensor, loc: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor) -> None:
    """cache[loc[t], 0] = [latent[t] | k_rope[t]] in one kernel (a torch cat and an index_put were two): cache
    [slots, 1, kv_lora + rope] with contiguous rows, latent [T, kv_lora] / k_rope [T, rope] of the cache's dtype
    (strided rows are fine: kv_a's rope columns)."""
    tokens, kv_lora = latent.shape
    rope = k_rope.shape[-1]
    if cache.dtype != latent.dtype or cache.dtype != k_rope.dtype or cache.shape[-1] != kv_lora + rope:
        raise ValueError(f"rows {latent.dtype} {kv_lora} + {k_rope.dtype} {rope} for a {cache.dtype} cache")
    if tokens == 0:
        return
    pdl = pdl_available(latent)
    extra = {"num_warps": 4, "launch_pdl": pdl} if latent.is_cuda else {}
    _store_latent_rows[(tokens,)](
        cache,
        loc,
        latent,
        k_rope,
        cache.stride(0),
        latent.stride(0),
        k_rope.stride(0),
        KV_LORA=kv_lora,
        ROPE=rope,
        BLOCK_LORA=triton.next_power_of_2(kv_lora),
        BLOCK_ROPE=triton.next_power_of_2(rope),
        PDL=pdl,
        **extra,
    )
