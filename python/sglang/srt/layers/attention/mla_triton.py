"""MLA attention on the triton backend, in its two forms (the math: layers/attention/mla_torch.py).

- Absorbed: each query's nope part goes through W_UK into the latent space, the latent kernel
  (triton_ops/mla_decode.py) attends over the request's cached rows for BLOCK_H heads at a time, W_UV maps the
  latent context to each head's values. Decode always takes it. An extend takes it too, one "decode row" per new
  token over its causal list of slots (the prefix and the new tokens up to itself, all already in the pool).
- Decompressed: the prefix rows and the new rows go through kv_b_proj into per-head keys and values, then the
  ordinary extend kernel. Its cost grows with (prefix + new) x heads x kv_b_proj; the absorbed form's with
  new x (prefix + new) x heads x the latent width: few new tokens over a long prefix favour absorbing, a long
  prefill favours decompressing.

Which form an extend batch takes is one rule (use_absorbed_extend) with one constant, set from
benchmark/mla/bench_mla_prefill.py's crossover on the H200 (benchmark/mla/README.md).
"""

from __future__ import annotations

from typing import Sequence

import torch

from sglang.srt.layers.attention.triton_ops import extend_attention_fwd
from sglang.srt.layers.attention.triton_ops.head_matmul import HEAD_MATMUL_MAX_TOKENS, head_matmul
from sglang.srt.layers.attention.triton_ops.kv_indices import fill_kv_indices_triton
from sglang.srt.layers.attention.triton_ops.mla_decode import mla_decode_fwd

# An extend batch is absorbed when none of its requests adds more new tokens than this, decompressed otherwise.
# The crossover of benchmark/mla/bench_mla_prefill.py on the H200 (2026-12-04; DeepSeek-V3 and V2-Lite attention
# shapes, prefixes 0-16k): the largest extend size up to which the absorbed form wins, its time summed over the
# prefixes (its `suggested_threshold`, the smaller of the two shapes': V3 16, V2-Lite 32).
ABSORBED_EXTEND_MAX_TOKENS = 16


def use_absorbed_extend(extend_seq_lens: Sequence[int]) -> bool:
    """The extend form for a batch whose requests add `extend_seq_lens` new tokens each."""
    return max(extend_seq_lens, default=0) <= ABSORBED_EXTEND_MAX_TOKENS


def token_row_lists(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    extend_prefix_lens_cpu: Sequence[int],
    extend_seq_lens_cpu: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr [T+1], slots) for the absorbed extend: new token j of request i (prefix P_i) sees
    req_to_token[req_i, :P_i + j + 1]. Device ops only; the host lengths size the outputs."""
    device = req_pool_indices.device
    num_tokens = sum(extend_seq_lens_cpu)
    total = sum(n * p + n * (n + 1) // 2 for p, n in zip(extend_prefix_lens_cpu, extend_seq_lens_cpu))
    counts = (qo_indptr[1:] - qo_indptr[:-1]).long()
    req = torch.repeat_interleave(torch.arange(counts.shape[0], device=device), counts, output_size=num_tokens)
    offset = torch.arange(num_tokens, device=device, dtype=torch.int32) - qo_indptr[req]
    lens = extend_prefix_lens[req].to(torch.int32) + offset + 1
    indptr = torch.zeros(num_tokens + 1, dtype=torch.int32, device=device)
    torch.cumsum(lens, dim=0, dtype=torch.int32, out=indptr[1:])
    indices = torch.empty(total, dtype=torch.int32, device=device)
    fill_kv_indices_triton(indices, req_to_token, req_pool_indices[req], indptr)
    return indptr, indices


def absorbed_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scaling: float,
    q_latent: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query row per token over its slot list (kv_indices[kv_indptr[t]:kv_indptr[t+1]] of `cache`
    [slots, 1, kv_lora + rope]): q_nope [T, H, nope], q_rope [T, H, rope] -> [T, H, v] (contiguous).
    `q_latent` [T, H, kv_lora]: q_nope through W_UK already (the backend's `mla_query_absorb`; up to
    HEAD_MATMUL_MAX_TOKENS tokens).

    Both projections are batched over heads, so every intermediate is laid out as the next op reads it: no copy
    kernels between them (an einsum's [T, H, v] result would need one before the reshape). Up to
    HEAD_MATMUL_MAX_TOKENS tokens (decode) they run in head_matmul's kernel, launched with PDL like the attention
    kernels between them; above, on torch.bmm ([H, T, .] operands).
    """
    tokens, heads = q_nope.shape[:2]
    out = torch.empty((tokens, heads, w_uv.shape[1]), dtype=q_nope.dtype, device=q_nope.device)
    if tokens <= HEAD_MATMUL_MAX_TOKENS:
        if q_latent is None:
            q_latent = head_matmul(q_nope, w_uk)  # [T, H, kv_lora]: W_UK absorbed into the query
        context = mla_decode_fwd(q_latent, q_rope, cache, kv_indptr, kv_indices, scaling)  # [T, H, kv_lora]
        return head_matmul(context, w_uv.transpose(1, 2), out=out)
    q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk)  # [H, T, kv_lora]
    context = torch.empty_like(q_latent)  # [H, T, kv_lora], written by the kernel as [T, H, kv_lora]
    mla_decode_fwd(q_latent.transpose(0, 1), q_rope, cache, kv_indptr, kv_indices, scaling, out=context.transpose(0, 1))
    torch.bmm(context, w_uv.transpose(1, 2), out=out.transpose(0, 1))  # [H, T, v] into the [T, H, v] buffer
    return out


def decompress(latent: torch.Tensor, k_rope: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor):
    """Latent rows [T, kv_lora] and their rotated keys [T, rope] -> every head's keys [T, H, nope + rope] and
    values [T, H, v] (kv_b_proj; the rope part of the key is shared by all heads)."""
    heads = w_uk.shape[0]
    k_nope = torch.einsum("tc,hnc->thn", latent, w_uk)
    k = torch.cat([k_nope, k_rope[:, None, :].expand(-1, heads, -1)], dim=-1)
    return k, torch.einsum("tc,hvc->thv", latent, w_uv).contiguous()


def decompressed_extend(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    cache: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_len_extend: int,
    scaling: float,
) -> torch.Tensor:
    """The new tokens (latent [T, kv_lora], k_rope [T, rope]) and each request's cached prefix (kv_indices of
    `cache`) decompressed, then causal attention: q_nope [T, H, nope], q_rope [T, H, rope] -> [T, H, v]."""
    kv_lora = w_uk.shape[-1]
    k_new, v_new = decompress(latent, k_rope, w_uk, w_uv)
    prefix = cache[kv_indices.long(), 0].to(q_nope.dtype)  # [P, kv_lora + rope]
    k_prefix, v_prefix = decompress(prefix[:, :kv_lora], prefix[:, kv_lora:], w_uk, w_uv)
    n, heads = q_nope.shape[:2]
    o = torch.empty((n, heads, w_uv.shape[1]), dtype=q_nope.dtype, device=q_nope.device)
    extend_attention_fwd(
        torch.cat([q_nope, q_rope], dim=-1),
        k_new,
        v_new,
        o,
        k_prefix,
        v_prefix,
        qo_indptr,
        kv_indptr,
        torch.arange(prefix.shape[0], dtype=torch.int32, device=q_nope.device),  # the gathered prefix rows
        max_len_extend,
        scaling,
        is_causal=True,
    )
    return o
