"""MLA decode (absorbed) over the latent pool, split-KV: attention of every head's latent-space query over each
request's latent rows [c_kv | k_rope].

Inputs (one layer):
  * ``q_latent [bs, H, KV_LORA]``: q_nope already through W_UK (mla_torch.absorbed_decode's first einsum);
    ``q_rope [bs, H, ROPE]`` rotated;
  * ``cache [num_slots, 1, KV_LORA + ROPE]``: MLATokenToKVPool's buffer (any float dtype; fp8 read as bytes
    viewed back, converted on load);
  * ``kv_indptr [bs+1]`` / ``kv_indices``: request ``i`` owns slots ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``
    (the triton backend's decode metadata, also in CUDA graphs).
Output: the latent context ``[bs, H, KV_LORA]`` (fp32); W_UV maps it to each head's values after.

One program serves BLOCK_H heads of one request over one chunk of its rows, so each latent row is read once per
BLOCK_H heads (once for all heads when H <= BLOCK_H, e.g. DeepSeek-V2-Lite's 16), instead of once per head as
a decompressed cache would need. Chunks (``num_kv_splits``, a host int: graphs capture a fixed grid) give a
batch of 1 enough programs; their partial contexts and log-sum-exps merge in torch (no host sync).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mla_decode_stage1(
    q_latent,
    q_rope,
    cache,
    kv_indptr,
    kv_indices,
    partial,
    lse,
    scaling,
    stride_ql_b,
    stride_ql_h,
    stride_qr_b,
    stride_qr_h,
    stride_c,
    stride_p_b,
    stride_p_h,
    stride_p_s,
    stride_l_b,
    stride_l_h,
    num_heads,
    NUM_SPLITS: tl.constexpr,
    KV_LORA: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    offs_c = tl.arange(0, KV_LORA)
    offs_r = tl.arange(0, BLOCK_ROPE)
    rope_ok = offs_r < ROPE

    start_req = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - start_req
    split_len = tl.cdiv(kv_len, NUM_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, kv_len)

    # The dots run in the activation dtype (tensor cores for bf16) with fp32 accumulation; softmax in fp32.
    dtype = q_latent.dtype.element_ty
    ql = tl.load(
        q_latent + b * stride_ql_b + heads[:, None] * stride_ql_h + offs_c[None, :], mask=head_ok[:, None], other=0.0
    )
    qr = tl.load(
        q_rope + b * stride_qr_b + heads[:, None] * stride_qr_h + offs_r[None, :],
        mask=head_ok[:, None] & rope_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, KV_LORA], dtype=tl.float32)
    n0 = start
    while n0 < end:  # a while loop: the triton interpreter's range() rejects device-read bounds (triton_loops.py)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        slots = tl.load(kv_indices + start_req + offs_n, mask=n_ok, other=0).to(tl.int64)
        rows = cache + slots[:, None] * stride_c
        latent = tl.load(rows + offs_c[None, :], mask=n_ok[:, None], other=0.0).to(dtype)  # [N, KV_LORA]
        k_rope = tl.load(rows + KV_LORA + offs_r[None, :], mask=n_ok[:, None] & rope_ok[None, :], other=0.0).to(dtype)
        scores = tl.dot(ql, tl.trans(latent)) + tl.dot(qr, tl.trans(k_rope))
        scores = tl.where(n_ok[None, :], scores * scaling, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(dtype), latent)
        m_i = m_new
        n0 += BLOCK_N

    has_rows = end > start
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        partial + b * stride_p_b + heads[:, None] * stride_p_h + split * stride_p_s + offs_c[None, :],
        out,
        mask=head_ok[:, None],
    )
    chunk_lse = tl.where(has_rows, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(lse + b * stride_l_b + heads * stride_l_h + split, chunk_lse, mask=head_ok)


def mla_decode_fwd(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scaling: float,
    num_kv_splits: int = 4,
    block_h: int = 16,
    block_n: int = 16,
) -> torch.Tensor:
    """q_latent [bs, H, KV_LORA], q_rope [bs, H, ROPE], cache [slots, 1, KV_LORA + ROPE] -> latent context
    [bs, H, KV_LORA] fp32 (zeros for a request with no rows). KV_LORA must be a power of two (512 for DeepSeek)."""
    bs, heads, kv_lora = q_latent.shape
    rope = q_rope.shape[-1]
    if kv_lora & (kv_lora - 1) or kv_lora < 16:
        raise ValueError(f"the MLA decode kernel needs a power-of-two kv_lora_rank >= 16, got {kv_lora}")
    if cache.shape[-1] != kv_lora + rope or cache.stride(-1) != 1:
        raise ValueError(f"cache rows must be {kv_lora} + {rope} contiguous values, got {tuple(cache.shape)}")
    partial = torch.empty((bs, heads, num_kv_splits, kv_lora), dtype=torch.float32, device=q_latent.device)
    lse = torch.empty((bs, heads, num_kv_splits), dtype=torch.float32, device=q_latent.device)
    if bs == 0:
        return partial.sum(2)
    grid = (bs, triton.cdiv(heads, block_h), num_kv_splits)
    _mla_decode_stage1[grid](
        q_latent,
        q_rope,
        cache,
        kv_indptr,
        kv_indices,
        partial,
        lse,
        scaling,
        q_latent.stride(0),
        q_latent.stride(1),
        q_rope.stride(0),
        q_rope.stride(1),
        cache.stride(0),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        heads,
        NUM_SPLITS=num_kv_splits,
        KV_LORA=kv_lora,
        ROPE=rope,
        BLOCK_ROPE=max(16, triton.next_power_of_2(rope)),
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        num_warps=8 if q_latent.is_cuda else 4,  # a [BLOCK_H, KV_LORA] fp32 accumulator per program
    )
    return merge_splits(partial, lse)


def merge_splits(partial: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Combine the chunks' softmax-normalised contexts by their log-sum-exps (empty chunks weigh 0)."""
    top = lse.max(dim=-1, keepdim=True).values
    weights = torch.exp(lse - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))  # [bs, H, S]
    total = weights.sum(dim=-1, keepdim=True)
    merged = (weights[..., None] * partial).sum(dim=2) / torch.where(total > 0, total, torch.ones_like(total))
    return merged
