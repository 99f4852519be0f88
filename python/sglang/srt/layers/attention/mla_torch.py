"""Multi-head latent attention (DeepSeek-V2/V3) over the latent KV cache, in plain torch (any device).

The cache holds per token one row [c_kv (kv_lora_rank) | k_rope (qk_rope_head_dim)] (MLATokenToKVPool).
kv_b_proj maps c_kv to every head's key part without rotary and its value:
    k_nope[h] = W_UK[h] c_kv   (W_UK[h]: [qk_nope, kv_lora])     v[h] = W_UV[h] c_kv   (W_UV[h]: [v_dim, kv_lora])
so q[h] . k[h] = (W_UK[h]^T q_nope[h]) . c_kv + q_rope[h] . k_rope.

- Decode (absorbed): each query's nope part goes through W_UK into the latent space once, attention runs over
  the latent rows for all heads at once (one read of each request's rows), and W_UV maps the latent context to
  each head's value space after. Nothing per head is decompressed.
- Extend (decompressed): the request's rows (prefix and new) go through kv_b_proj into per-head keys and
  values, then ordinary causal attention; for a prefill the query count makes the absorbed form no cheaper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from sglang.srt.layers.mla_attention import MLAAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def split_kv_b(w_kv_b: torch.Tensor, num_heads: int, qk_nope: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight [heads * (qk_nope + v), kv_lora] -> (W_UK [heads, qk_nope, kv_lora],
    W_UV [heads, v, kv_lora]), views (each head's rows are its key part then its value part)."""
    w = w_kv_b.view(num_heads, -1, w_kv_b.shape[-1])
    return w[:, :qk_nope], w[:, qk_nope:]


def absorbed_decode(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    rows: torch.Tensor,
    valid: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """One new token per request. q_nope [B, H, nope], q_rope [B, H, rope], rows [B, L, kv_lora + rope] (each
    request's cached rows, padded), valid [B, L] -> [B, H, v]."""
    kv_lora = w_uk.shape[-1]
    rows = rows.masked_fill(~valid[:, :, None], 0)  # padding slots may hold anything (NaN): zero, then mask
    q_latent = torch.einsum("bhn,hnc->bhc", q_nope, w_uk)  # the query in the latent space
    q = torch.cat([q_latent, q_rope], dim=-1)  # [B, H, kv_lora + rope]: one "head" of the latent width
    scores = torch.einsum("bhd,bld->bhl", q, rows).float() * scaling
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1)).to(q.dtype)  # an empty (padding) request has no row
    context = torch.einsum("bhl,blc->bhc", probs, rows[..., :kv_lora])  # [B, H, kv_lora]
    return torch.einsum("bhc,hvc->bhv", context, w_uv)


def decompressed_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    rows: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    prefix: int,
    scaling: float,
) -> torch.Tensor:
    """One request's new tokens. q_nope [n, H, nope], q_rope [n, H, rope], rows [prefix + n, kv_lora + rope]
    (its cached rows, the new ones last) -> [n, H, v]; new token i sees positions <= prefix + i."""
    kv_lora = w_uk.shape[-1]
    latent, k_rope = rows[:, :kv_lora], rows[:, kv_lora:]
    k_nope = torch.einsum("lc,hnc->hln", latent, w_uk)  # [H, L, nope]
    v = torch.einsum("lc,hvc->hlv", latent, w_uv)  # [H, L, v]
    k = torch.cat([k_nope, k_rope[None].expand(k_nope.shape[0], -1, -1)], dim=-1)
    q = torch.cat([q_nope, q_rope], dim=-1).transpose(0, 1)  # [H, n, nope + rope]
    n, total = q.shape[1], k.shape[1]
    mask = None
    if prefix > 0:
        mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, is_causal=mask is None, scale=scaling
    )
    return out.squeeze(0).transpose(0, 1)


def forward(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_kv_b: torch.Tensor,
    layer: "MLAAttention",
    forward_batch: "ForwardBatch",
    save_kv_cache: bool = True,
) -> torch.Tensor:
    """Store this step's rows (latent [T, kv_lora], k_rope [T, rope]) in the pool (unless `save_kv_cache` is
    False: stored already), then attend: decode absorbed, extend decompressed. q_nope [T, H, nope], q_rope
    [T, H, rope] (this rank's heads) -> [T, H * v]."""
    if q_nope.is_cuda and torch.cuda.is_current_stream_capturing():
        # The torch path reads the batch's lengths on the host: it cannot be replayed from a graph.
        raise RuntimeError("MLA decode on the torch path cannot be captured in a CUDA graph")
    fb = forward_batch
    pool = fb.token_to_kv_pool
    if save_kv_cache:
        pool.set_mla_kv_buffer(layer.layer_id, fb.out_cache_loc, latent, k_rope)
    cache = pool.get_key_buffer(layer.layer_id)[:, 0]  # [slots, kv_lora + rope]
    w_uk, w_uv = split_kv_b(w_kv_b, layer.num_heads, layer.qk_nope_head_dim)
    req_to_token = fb.req_to_token_pool.req_to_token
    num_tokens = q_nope.shape[0]
    if fb.forward_mode.is_decode():
        max_len = max(fb.seq_lens_cpu) if fb.seq_lens_cpu else 0
        table = req_to_token[fb.req_pool_indices, :max_len].long()
        valid = torch.arange(max_len, device=table.device)[None, :] < fb.seq_lens[:, None]
        rows = cache[table].to(q_nope.dtype)
        out = absorbed_decode(q_nope, q_rope, rows, valid, w_uk, w_uv, layer.scaling)
        return out.reshape(num_tokens, -1)
    out = torch.empty(num_tokens, layer.num_heads, layer.v_head_dim, dtype=q_nope.dtype, device=q_nope.device)
    start = 0
    for i, (prefix, ext) in enumerate(zip(fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu)):
        slots = req_to_token[fb.req_pool_indices[i], : prefix + ext].long()
        end = start + ext
        out[start:end] = decompressed_attention(
            q_nope[start:end], q_rope[start:end], cache[slots].to(q_nope.dtype), w_uk, w_uv, prefix, layer.scaling
        )
        start = end
    return out.view(num_tokens, -1)
