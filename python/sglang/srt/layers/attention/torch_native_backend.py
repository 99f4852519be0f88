"""Reference attention in plain torch: runs on CPU and GPU, and is what the triton kernels are checked against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


@dataclass(frozen=True)
class _SlotTable:
    """The keys one decode query reads: slots [bs, width], which of them it may see, and whether any may not (a
    padded row's tail: slot 0 or stale rows, to be zeroed before use)."""

    slots: torch.Tensor
    visible: torch.Tensor
    padded: bool


@dataclass
class _DecodeMetadata:
    """One group of a decode batch's requests, attended to as one padded batch."""

    seq_lens_cpu: List[int]
    seq_lens: torch.Tensor
    full_table: torch.Tensor  # [rows, max_len] every slot of each request (padded)
    rows: Optional[torch.Tensor]  # the group's rows of the batch; None: the whole batch, in order
    # The tables the layers read, made on first use: by the window (0: none) and whether the layer reads the
    # hybrid SWA pool's window pool (its slots mapped).
    tables: Dict[Tuple[int, bool], _SlotTable] = field(default_factory=dict)


# A decode batch is split by length only where padding every request to the longest would read this many keys
# more than the requests have, and more than twice as many: one long request among many short ones (a 3,000-token
# prompt beside 256 short samples) otherwise made every short one gather and attend over 3,000 keys in every layer.
SPLIT_MIN_PADDED_KEYS = 16384


def decode_groups(seq_lens: Sequence[int], min_padded_keys: int = SPLIT_MIN_PADDED_KEYS) -> List[List[int]]:
    """The batch's rows in groups attended to together: all of them, unless padding to the longest costs more than
    `min_padded_keys` keys and twice the real ones; then by length class (lengths within a power of two), so
    that no group pads its requests to more than twice their length."""
    rows = list(range(len(seq_lens)))
    if not seq_lens:
        return [rows]
    real, padded = sum(seq_lens), len(seq_lens) * max(seq_lens)
    if padded - real <= min_padded_keys or padded <= 2 * real:
        return [rows]
    classes: Dict[int, List[int]] = {}
    for i, n in enumerate(seq_lens):
        classes.setdefault(max(n - 1, 0).bit_length(), []).append(i)
    return [classes[c] for c in sorted(classes)]


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, model_runner, split_min_padded_keys: int = SPLIT_MIN_PADDED_KEYS) -> None:
        self.device = model_runner.device
        self.split_min_padded_keys = split_min_padded_keys  # decode_groups' threshold (the benchmark varies it)

    def init_forward_metadata(self, forward_batch) -> None:
        if not forward_batch.forward_mode.is_decode():
            forward_batch.attn_metadata = None
            return
        lens = list(forward_batch.seq_lens_cpu)
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        groups = decode_groups(lens, self.split_min_padded_keys)
        metadata = []
        for group in groups:
            rows = None if len(groups) == 1 else torch.tensor(group, device=forward_batch.seq_lens.device)
            pool_rows, seq_lens = forward_batch.req_pool_indices, forward_batch.seq_lens
            if rows is not None:
                pool_rows, seq_lens = pool_rows[rows], seq_lens[rows]
            table = req_to_token[pool_rows, : max((lens[i] for i in group), default=0)].long()
            metadata.append(_DecodeMetadata([lens[i] for i in group], seq_lens, table, rows))
        forward_batch.attn_metadata = metadata

    @staticmethod
    def _slot_table(md: _DecodeMetadata, window: int, pool, layer_id: int) -> _SlotTable:
        """What a layer with this window reads: a windowed layer only each request's last `window` slots (the
        keys it may see, right-aligned to the request's end), so its gather and attention cover the window, not
        the context; a layer of the window pool reads them mapped into that pool."""
        max_len = md.full_table.shape[1]
        window = window if 0 < window < max_len else 0
        key = (window, pool.is_swa_layer(layer_id))
        table = md.tables.get(key)
        if table is not None:
            return table
        device = md.full_table.device
        if window:
            start = (md.seq_lens - window).clamp(min=0)
            positions = (start[:, None] + torch.arange(window, device=device)[None, :]).clamp(max=max_len - 1)
            slots = md.full_table.gather(1, positions)
            visible = torch.arange(window, device=device)[None, :] < md.seq_lens.clamp(max=window)[:, None]
            padded = any(length < window for length in md.seq_lens_cpu)
        else:
            slots = md.full_table
            visible = torch.arange(max_len, device=device)[None, :] < md.seq_lens[:, None]
            padded = any(length != max_len for length in md.seq_lens_cpu)
        if key[1]:
            slots = pool.to_swa_slots(slots)
        table = md.tables[key] = _SlotTable(slots, visible, padded)
        return table

    @staticmethod
    def _save(layer, forward_batch, k, v) -> None:
        pool = forward_batch.token_to_kv_pool
        pool.set_kv_buffer(
            layer.layer_id,
            forward_batch.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
            v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
            layer.k_scale,
            layer.v_scale,
        )

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if save_kv_cache:
            self._save(layer, forward_batch, k, v)
        groups: List[_DecodeMetadata] = forward_batch.attn_metadata
        pool = forward_batch.token_to_kv_pool
        if len(groups) == 1:
            return self._decode_group(q, layer, pool, groups[0])
        out = q.new_empty(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)
        for md in groups:
            out[md.rows] = self._decode_group(q[md.rows], layer, pool, md)
        return out

    def _decode_group(self, q: torch.Tensor, layer, pool, md: _DecodeMetadata) -> torch.Tensor:
        """Decode attention of one group's queries q [rows, Hq * D] over their padded slot table."""
        bs, hkv, hq = q.shape[0], layer.tp_k_head_num, layer.tp_q_head_num
        table = self._slot_table(md, layer.sliding_window_size, pool, layer.layer_id)
        keys = _dequantized(pool.get_key_buffer(layer.layer_id)[table.slots], q.dtype, layer.k_scale)
        values = _dequantized(pool.get_value_buffer(layer.layer_id)[table.slots], q.dtype, layer.v_scale)
        visible = table.visible
        if table.padded:
            # Padded positions point at slots this request never wrote or no longer holds (slot 0, stale rows):
            # their values may be NaN/inf, and neither a -inf score added to NaN nor a zero probability times NaN
            # is zero.
            keys = keys.masked_fill(~visible[:, :, None, None], 0)
            values = values.masked_fill(~visible[:, :, None, None], 0)
        if layer.logit_cap > 0:  # soft-capping (Gemma 2) has no place in SDPA: the scores by hand
            qh = q.view(bs, hkv, hq // hkv, layer.qk_head_dim)  # [bs, Hkv, group, D] against keys [bs, L, Hkv, D]
            scores = _cap(torch.einsum("bhgd,blhd->bhgl", qh, keys).float() * layer.scaling, layer.logit_cap)
            scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(q.dtype)
            out = torch.einsum("bhgl,blhd->bhgd", torch.nan_to_num(probs), values)
        else:
            # One fused op instead of a dozen small ones: on the CPU a SmolLM2 layer's decode attention takes 83 us
            # against 187 at batch 1, 556 against 944 at 16 (one thread, 60 keys; benchmark/cpu_throughput/,
            # --components). Query head h reads KV head h // (Hq / Hkv), the grouping the soft-capping branch's view
            # spells out.
            out = F.scaled_dot_product_attention(
                q.view(bs, hq, 1, layer.qk_head_dim),
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=visible[:, None, None, :],
                scale=layer.scaling,
                enable_gqa=hq != hkv,
            )
        # A padding row (no visible slot) is NaN from the softmax: zeros, as before.
        return torch.nan_to_num(out).reshape(bs, hq * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if save_kv_cache:
            self._save(layer, forward_batch, k, v)
        pool = forward_batch.token_to_kv_pool
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        hq, d = layer.tp_q_head_num, layer.qk_head_dim
        out = torch.empty(q.shape[0], hq, layer.v_head_dim, dtype=q.dtype, device=q.device)
        qh = q.view(-1, hq, d)
        start = 0
        for i, (prefix, ext) in enumerate(zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu)):
            seq = prefix + ext
            # A windowed layer of the hybrid SWA pool reads the window pool, from the first key its first new token
            # sees (earlier tokens may have left that pool).
            first = max(0, prefix - layer.sliding_window_size + 1) if pool.is_swa_layer(layer.layer_id) else 0
            slots = req_to_token[forward_batch.req_pool_indices[i], first:seq].long()
            if pool.is_swa_layer(layer.layer_id):
                slots = pool.to_swa_slots(slots)
            keys = _dequantized(k_buf[slots], q.dtype, layer.k_scale).transpose(0, 1)  # [Hkv, seq - first, D]
            values = _dequantized(v_buf[slots], q.dtype, layer.v_scale).transpose(0, 1)
            query = qh[start : start + ext].transpose(0, 1)  # [Hq, ext, D]
            # Positions relative to `first`: the causal and window masks only compare differences.
            out[start : start + ext] = _causal_attention(query, keys, values, prefix - first, layer).transpose(0, 1)
            start += ext
        return out.view(q.shape[0], hq * layer.v_head_dim)


def _dequantized(rows: torch.Tensor, dtype: torch.dtype, scale: Optional[float]) -> torch.Tensor:
    """Cached K or V rows in the activation dtype, times the checkpoint's KV scale where the cache has one."""
    rows = rows.to(dtype)
    return rows if scale is None else rows * scale


def _cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(scores / cap) if cap > 0 else scores


def _causal_attention(q, k, v, prefix: int, layer) -> torch.Tensor:
    """q [Hq, n, D] attends to k/v [Hkv, prefix + n, D]; new token i sees positions <= prefix + i (and, with a
    sliding window W, > prefix + i - W: transformers' Mistral window)."""
    group = q.shape[0] // k.shape[0]
    if group > 1:
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
    n, total = q.shape[1], k.shape[1]
    window = layer.sliding_window_size

    def full_mask() -> torch.Tensor:
        mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
        return mask.triu(diagonal=prefix - window + 1) if window > 0 else mask

    if layer.logit_cap > 0:
        scores = _cap(torch.matmul(q, k.transpose(1, 2)).float() * layer.scaling, layer.logit_cap)
        scores = scores.masked_fill(~full_mask(), float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), v)
    mask: Optional[torch.Tensor] = None
    if prefix > 0 or 0 < window < total:
        mask = full_mask()
    return F.scaled_dot_product_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, is_causal=mask is None, scale=layer.scaling
    ).squeeze(0)
