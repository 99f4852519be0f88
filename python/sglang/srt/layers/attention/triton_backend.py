"""Triton attention backend: split-KV decode and prefix-aware extend over the token-major KV pool.

Per batch it builds, once, the flattened slot list of every request (kv_indptr / kv_indices) with
device ops only; the layers then call the kernels. For CUDA graphs the same metadata is written
into static buffers before each replay, so the captured kernels read fresh indices every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.attention.mla_triton import (
    absorbed_attention,
    decompressed_extend,
    token_row_lists,
    use_absorbed_extend,
)
from sglang.srt.layers.attention.triton_ops import (
    MIN_BLOCK_TOKENS,
    DecodeKernelConfig,
    decode_attention_fwd,
    decode_split_bounds,
    extend_attention_fwd,
    get_num_kv_splits,
)
from sglang.srt.layers.attention.triton_ops.decode_attention import writes_quantized
from sglang.srt.layers.attention.triton_ops.head_matmul import HEAD_MATMUL_MAX_TOKENS, HeadMatmul
from sglang.srt.layers.attention.triton_ops.kv_indices import fill_kv_indices_triton
from sglang.srt.layers.quantization.block_fp8_activation import (
    ActivationLayout,
    BlockFp8Activation,
    empty_block_fp8_activation,
)


@dataclass
class TritonMetadata:
    kv_indptr: torch.Tensor  # [bs+1] int32
    kv_indices: torch.Tensor  # slots, int32 (the pool has < 2^31 slots)
    qo_indptr: Optional[torch.Tensor] = None  # extend only
    max_len_extend: int = 0
    num_kv_splits: Optional[torch.Tensor] = None  # decode only
    attn_logits: Optional[torch.Tensor] = None
    attn_lse: Optional[torch.Tensor] = None
    max_kv_splits: int = 1
    # An MLA extend batch the absorbed form serves (mla_triton.use_absorbed_extend): every new token's causal
    # slot list (the prefix and the new tokens up to itself).
    token_kv_indptr: Optional[torch.Tensor] = None
    token_kv_indices: Optional[torch.Tensor] = None
    # The hybrid SWA pool: kv_indices in the window pool's slots, which its windowed layers read (a token out of
    # every window maps to the dummy slot 0; the kernels never let a query see it). None without that pool.
    swa_kv_indices: Optional[torch.Tensor] = None


# Split-KV scratch is [bs, heads, splits, head_dim] fp32. Large eager batches need no splits for
# parallelism (bs * heads programs fill the GPU), so splits are capped to keep the scratch bounded
# (<= this many rows x splits): ~67 MB for 32 heads of 128, whatever the batch size.
SPLIT_SCRATCH_ROWS = 4096
# Upper bound on split-KV chunks per request in the decode kernel (16: tune_decode_attention.py).
MAX_KV_SPLITS = 16


def fill_kv_indices(
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    total: int,
) -> None:
    """out[indptr[i] + j] = req_to_token[req_pool_indices[i], j] for j < lens[i], without a host sync.

    `total` (= sum(lens), known on the host) sizes the work; each flat position finds its request
    by binary search over kv_indptr.
    """
    if total == 0:
        return
    flat = torch.arange(total, device=out.device, dtype=torch.int32)
    req = torch.searchsorted(kv_indptr[1:], flat, right=True)
    pos = flat - kv_indptr[req]
    out[:total] = req_to_token[req_pool_indices[req], pos]


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, model_runner) -> None:
        mc = model_runner.model_config
        self.device = model_runner.device
        self.num_q_heads = mc.head_partition(model_runner.tp_size, model_runner.tp_rank).num_q_heads
        self.v_head_dim = mc.v_head_dim
        self.max_kv_splits = MAX_KV_SPLITS
        self.num_kv_heads = mc.get_num_kv_heads(model_runner.tp_size, model_runner.tp_rank)
        # Stage-1 programs per decode step scale with the SM count (decode_split_bounds).
        self.num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count if self.device == "cuda" else 1
        )
        self.kernel_config = DecodeKernelConfig.for_head_dim(max(mc.head_dim, self.v_head_dim))
        # A long context gets one chunk per this many keys: few long chunks stream best once the batch
        # fills the SMs; small batches get more chunks (decode_split_bounds, tune_decode_attention.py).
        self.min_block_tokens = MIN_BLOCK_TOKENS
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.max_context_len = self.req_to_token.shape[1]
        self.is_mla = mc.is_mla
        self.graph: Optional[TritonMetadata] = None
        pool = model_runner.token_to_kv_pool
        self.window_pool = pool if pool.has_window_pool else None

    # ------------------------------------------------------------- metadata
    def _indptr(self, lens: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        bs = lens.shape[0]
        indptr = out if out is not None else torch.empty(bs + 1, dtype=torch.int32, device=self.device)
        indptr[:1].zero_()  # a kernel: `indptr[0] = 0` copies a host scalar and waits for the stream
        torch.cumsum(lens, dim=0, dtype=torch.int32, out=indptr[1 : bs + 1])
        return indptr[: bs + 1]

    def _scratch(self, bs: int, splits: int):
        logits = torch.empty((bs, self.num_q_heads, splits, self.v_head_dim), dtype=torch.float32, device=self.device)
        lse = torch.empty((bs, self.num_q_heads, splits), dtype=torch.float32, device=self.device)
        return logits, lse

    def init_forward_metadata(self, forward_batch) -> None:
        fb = forward_batch
        if fb.forward_mode.is_decode():
            indptr = self._indptr(fb.seq_lens)
            indices = torch.empty(fb.seq_lens_sum, dtype=torch.int32, device=self.device)
            cap = max(1, min(self._split_cap(fb.batch_size), SPLIT_SCRATCH_ROWS // max(fb.batch_size, 1)))
            splits = torch.empty(fb.batch_size, dtype=torch.int32, device=self.device)
            self._fill(indices, fb.req_pool_indices, fb.seq_lens, indptr, fb.seq_lens_sum, splits, cap)
            logits, lse = self._scratch(fb.batch_size, cap)
            fb.attn_metadata = TritonMetadata(
                indptr,
                indices,
                num_kv_splits=splits,
                attn_logits=logits,
                attn_lse=lse,
                max_kv_splits=cap,
                swa_kv_indices=self._window_slots(indices),
            )
            return
        prefix_total = sum(fb.extend_prefix_lens_cpu)
        kv_indptr = self._indptr(fb.extend_prefix_lens)
        kv_indices = torch.empty(prefix_total, dtype=torch.int32, device=self.device)
        self._fill(kv_indices, fb.req_pool_indices, fb.extend_prefix_lens, kv_indptr, prefix_total)
        qo_indptr = self._indptr(fb.extend_seq_lens)
        md = TritonMetadata(
            kv_indptr, kv_indices, qo_indptr, max(fb.extend_seq_lens_cpu), swa_kv_indices=self._window_slots(kv_indices)
        )
        if self.is_mla and use_absorbed_extend(fb.extend_seq_lens_cpu):
            md.token_kv_indptr, md.token_kv_indices = token_row_lists(
                self.req_to_token,
                fb.req_pool_indices,
                fb.extend_prefix_lens,
                qo_indptr,
                fb.extend_prefix_lens_cpu,
                fb.extend_seq_lens_cpu,
            )
        fb.attn_metadata = md

    def _window_slots(self, indices: torch.Tensor) -> Optional[torch.Tensor]:
        """`indices` in the window pool's slots (hybrid SWA pool), once per batch for every windowed layer."""
        return None if self.window_pool is None else self.window_pool.to_swa_slots(indices)

    def _layer_indices(self, layer, md: TritonMetadata) -> torch.Tensor:
        """The slot list this layer reads: a windowed layer of the hybrid SWA pool reads the window pool's."""
        pool = self.window_pool
        return md.swa_kv_indices if pool is not None and pool.is_swa_layer(layer.layer_id) else md.kv_indices

    def _fill(self, indices, req_pool_indices, lens, indptr, total: int, splits=None, max_splits: int = 1) -> None:
        """kv_indices (and, given `splits`, the decode split counts) of a batch: one triton kernel on
        the GPU (a graph replay's only metadata work besides indptr), torch ops on the CPU."""
        bs = req_pool_indices.shape[0]
        min_splits, block_n = self._min_splits(bs), self.kernel_config.block_n
        if self.device == "cuda":
            fill_kv_indices_triton(
                indices,
                self.req_to_token,
                req_pool_indices,
                indptr,
                splits,
                max_splits,
                self.min_block_tokens,
                min_splits,
                block_n,
            )
            return
        fill_kv_indices(indices, self.req_to_token, req_pool_indices, lens, indptr, total)
        if splits is not None:
            get_num_kv_splits(splits, lens, max_splits, self.min_block_tokens, min_splits, block_n)

    # ------------------------------------------------------------ CUDA graph
    def init_cuda_graph_state(self, max_bs: int) -> None:
        logits, lse = self._scratch(max_bs, self.max_kv_splits)
        self.graph = TritonMetadata(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            kv_indices=torch.zeros(max_bs * self.max_context_len, dtype=torch.int32, device=self.device),
            num_kv_splits=torch.ones(max_bs, dtype=torch.int32, device=self.device),
            attn_logits=logits,
            attn_lse=lse,
            swa_kv_indices=None
            if self.window_pool is None
            else torch.zeros(max_bs * self.max_context_len, dtype=torch.int32, device=self.device),
        )

    def _graph_metadata(self, bs: int) -> TritonMetadata:
        g = self.graph
        return TritonMetadata(
            g.kv_indptr[: bs + 1],
            g.kv_indices,
            num_kv_splits=g.num_kv_splits[:bs],
            attn_logits=g.attn_logits[:bs],
            attn_lse=g.attn_lse[:bs],
            max_kv_splits=self._split_cap(bs),
            swa_kv_indices=g.swa_kv_indices,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices, seq_lens) -> TritonMetadata:
        self.init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, int(bs))
        return self._graph_metadata(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_pool_indices, seq_lens, seq_lens_sum: int) -> None:
        g = self.graph
        indptr = self._indptr(seq_lens[:bs], out=g.kv_indptr)
        self._fill(
            g.kv_indices,
            req_pool_indices[:bs],
            seq_lens[:bs],
            indptr,
            seq_lens_sum,
            g.num_kv_splits[:bs],
            self._split_cap(bs),
        )
        if g.swa_kv_indices is not None:  # the captured windowed layers read this buffer
            g.swa_kv_indices[:seq_lens_sum] = self.window_pool.to_swa_slots(g.kv_indices[:seq_lens_sum])

    def _min_splits(self, bs: int) -> int:
        return decode_split_bounds(bs, self.num_kv_heads, self.num_sms, self.max_kv_splits)[0]

    def _split_cap(self, bs: int) -> int:
        return decode_split_bounds(bs, self.num_kv_heads, self.num_sms, self.max_kv_splits)[1]

    # ---------------------------------------------------------------- layers
    @staticmethod
    def _save(layer, fb, k, v) -> None:
        fb.token_to_kv_pool.set_kv_buffer(
            layer.layer_id,
            fb.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
            v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
            layer.k_scale,
            layer.v_scale,
        )

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._decode(q, k, v, layer, forward_batch, save_kv_cache, None).view(q.shape[0], -1)

    def forward_decode_quantized(
        self, q, k, v, layer, forward_batch, save_kv_cache: bool, layout: ActivationLayout
    ) -> Optional[BlockFp8Activation]:
        """The decode kernels write each 128-wide head's output quantized, one launch less a layer (see
        decode_attention_fwd); other head widths and cuBLAS's padded layout: None."""
        if not writes_quantized(layer.v_head_dim, layout):
            return None
        quantized = empty_block_fp8_activation(
            q.shape[0], layer.tp_q_head_num * layer.v_head_dim, q.dtype, layout, q.device
        )
        self._decode(q, k, v, layer, forward_batch, save_kv_cache, quantized)
        return quantized

    def _decode(self, q, k, v, layer, forward_batch, save_kv_cache, quantized) -> torch.Tensor:
        """o [bs, Hq, Dv] (not written where ``quantized`` takes the output instead)."""
        fb, md = forward_batch, forward_batch.attn_metadata
        if save_kv_cache:
            self._save(layer, fb, k, v)
        pool = fb.token_to_kv_pool
        bs = q.shape[0]
        o = torch.empty((bs, layer.tp_q_head_num, layer.v_head_dim), dtype=q.dtype, device=q.device)
        decode_attention_fwd(
            q.view(bs, layer.tp_q_head_num, layer.qk_head_dim),
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            o,
            md.kv_indptr,
            self._layer_indices(layer, md),
            md.attn_logits,
            md.attn_lse,
            md.num_kv_splits,
            md.max_kv_splits,
            layer.scaling,
            layer.logit_cap,
            self.kernel_config,
            sliding_window=layer.sliding_window_size,
            k_scale=layer.k_scale,
            v_scale=layer.v_scale,
            quantized=quantized,
        )
        return o

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        fb, md = forward_batch, forward_batch.attn_metadata
        if save_kv_cache:
            self._save(layer, fb, k, v)
        pool = fb.token_to_kv_pool
        n = q.shape[0]
        o = torch.empty((n, layer.tp_q_head_num, layer.v_head_dim), dtype=q.dtype, device=q.device)
        extend_attention_fwd(
            q.view(n, layer.tp_q_head_num, layer.qk_head_dim),
            k.view(n, layer.tp_k_head_num, layer.qk_head_dim).to(q.dtype),
            v.view(n, layer.tp_v_head_num, layer.v_head_dim).to(q.dtype),
            o,
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            md.qo_indptr,
            md.kv_indptr,
            self._layer_indices(layer, md),
            md.max_len_extend,
            layer.scaling,
            is_causal=True,
            logit_cap=layer.logit_cap,
            sliding_window=layer.sliding_window_size,
            k_scale=layer.k_scale,
            v_scale=layer.v_scale,
        )
        return o.view(n, -1)

    def mla_query_absorb(self, q_nope, w_kv_b, layer, forward_batch) -> Optional[HeadMatmul]:
        """Where the batch attends absorbed with head_matmul's kernels (decode, or an absorbed extend, up to
        HEAD_MATMUL_MAX_TOKENS tokens), the query's W_UK product is asked of the kernel before attention (rotary:
        one launch a layer fewer); `forward_mla` then takes it as `q_latent`."""
        tokens = q_nope.shape[0]
        fb = forward_batch
        if tokens > HEAD_MATMUL_MAX_TOKENS or not (
            fb.forward_mode.is_decode() or fb.attn_metadata.token_kv_indptr is not None
        ):
            return None
        from sglang.srt.layers.attention.mla_torch import split_kv_b

        w_uk, _ = split_kv_b(w_kv_b, layer.num_heads, layer.qk_nope_head_dim)
        out = torch.empty((tokens, layer.num_heads, layer.kv_lora_rank), dtype=q_nope.dtype, device=q_nope.device)
        return HeadMatmul(q_nope, w_uk, out)

    def forward_mla(
        self, q_nope, q_rope, latent, k_rope, w_kv_b, layer, forward_batch, save_kv_cache=True, q_latent=None
    ) -> torch.Tensor:
        """MLA on this backend's metadata (so decode also runs inside CUDA graphs), layers/attention/mla_triton.py:
        decode absorbed (the triton latent kernel); an extend absorbed or decompressed, as the batch's metadata
        says (use_absorbed_extend decided it once for every layer). `save_kv_cache` False: rotary stored the
        rows already."""
        from sglang.srt.layers.attention.mla_torch import split_kv_b

        fb = forward_batch
        md, pool = fb.attn_metadata, fb.token_to_kv_pool
        if save_kv_cache:
            pool.set_mla_kv_buffer(layer.layer_id, fb.out_cache_loc, latent, k_rope)
        cache = pool.get_key_buffer(layer.layer_id)
        w_uk, w_uv = split_kv_b(w_kv_b, layer.num_heads, layer.qk_nope_head_dim)
        n = q_nope.shape[0]
        if fb.forward_mode.is_decode():
            out = absorbed_attention(
                q_nope, q_rope, cache, w_uk, w_uv, md.kv_indptr, md.kv_indices, layer.scaling, q_latent
            )
        elif md.token_kv_indptr is not None:
            out = absorbed_attention(
                q_nope, q_rope, cache, w_uk, w_uv, md.token_kv_indptr, md.token_kv_indices, layer.scaling, q_latent
            )
        else:
            out = decompressed_extend(
                q_nope,
                q_rope,
                latent,
                k_rope,
                cache,
                w_uk,
                w_uv,
                md.qo_indptr,
                md.kv_indptr,
                md.kv_indices,
                md.max_len_extend,
                layer.scaling,
            )
        return out.reshape(n, -1)
