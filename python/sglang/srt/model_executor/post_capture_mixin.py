"""Post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1): apply what the planner decided.

Before graph capture: reserve the KV pool as CUDA virtual memory (one range per layer's K and V,
sized for every token free memory could hold) and back only the first granule of each range, the
dummy slot that padded graph rows write to. After capture: measure the worst-case activation peak
and what is really free, let pool_configurator.post_capture_pool_size decide, and back exactly that
much with physical memory behind the same addresses. Graph memory and activations are then
measured, not guessed.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.environ import envs
from sglang.srt.mem_cache.memory_pool import kv_storage_dtype
from sglang.srt.model_executor.pool_configurator import (
    GiB,
    backed_bytes_per_buffer,
    post_capture_pool_size,
    tokens_backed_before_capture,
    virtual_pool,
)

if TYPE_CHECKING:
    from sglang.srt.mem_cache.vmm import VirtualKVArena
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class PostCaptureKVSizingMixin:
    kv_arena: Optional["VirtualKVArena"]

    # ------------------------------------------------------------- reserve
    def reserve_virtual_kv_pool(self: "ModelRunner") -> None:
        from sglang.srt.mem_cache.vmm import VirtualKVArena

        pool = virtual_pool(self.readings, self.pool_args)
        kv, page = self.kv_geometry, self.server_args.page_size
        self.kv_arena = VirtualKVArena(kv.num_buffers, pool.reserve_bytes_per_buffer, self.gpu_id)
        self.readings = dataclasses.replace(self.readings, vmm_granularity_bytes=self.kv_arena.granularity)
        store = kv_storage_dtype(self.model_config.kv_cache_dtype)
        slots = pool.max_tokens + page
        buffers = []
        for layer in range(kv.num_layers):
            if kv.is_mla:  # one latent range per layer
                buffers.append(self.kv_arena.tensor(layer, store, (slots, 1, kv.head_dim)))
                continue
            buffers.append(self.kv_arena.tensor(2 * layer, store, (slots, kv.kv_heads, kv.head_dim)))
            buffers.append(self.kv_arena.tensor(2 * layer + 1, store, (slots, kv.kv_heads, kv.v_head_dim)))
        initial = tokens_backed_before_capture(self.readings, pool)
        self.create_kv_pools(initial, pool.max_running_requests, kv_buffers=buffers)
        logger.info(
            "Post-capture KV sizing: reserved %d layers x %d ranges of %.2f GB of address space (<= %d tokens); "
            "%d tokens backed until capture",
            kv.num_layers,
            kv.num_buffers // kv.num_layers,
            self.kv_arena.reserved_bytes_per_buffer / GiB,
            pool.max_tokens,
            initial,
        )

    # ------------------------------------------------------------- measure
    def measure_activation_peak_bytes(self: "ModelRunner") -> int:
        """Peak device memory the worst-case eager work takes: a full chunked prefill spread over
        as many requests as allowed (logits + sampling of each), and a decode step at
        max_running_requests (eager above the captured batch size) with top-p sampling. All KV
        writes go to the dummy slot, so nothing but slot 0 needs to be backed."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        sa, mc = self.server_args, self.model_config
        max_reqs = self.req_to_token_pool.size
        chunk = sa.chunked_prefill_size
        n_prefill = max(1, min(max_reqs, chunk))
        ext = [chunk // n_prefill + (1 if i < chunk % n_prefill else 0) for i in range(n_prefill)]
        probes = [
            ModelWorkerBatch(
                ForwardMode.EXTEND,
                [1] * chunk,
                [0] * n_prefill,
                ext,
                torch.zeros(chunk, dtype=torch.int64),
                extend_seq_lens=ext,
                extend_prefix_lens=[0] * n_prefill,
            ),
            ModelWorkerBatch(
                ForwardMode.DECODE,
                [1] * max_reqs,
                [0] * max_reqs,
                [1] * max_reqs,
                torch.zeros(max_reqs, dtype=torch.int64),
            ),
        ]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        for batch in probes:
            bs = len(batch.seq_lens)
            batch.sampling_info = SamplingBatchInfo(
                temperatures=torch.ones(bs, 1, device=self.device),
                top_ps=torch.full((bs,), 0.9, device=self.device),
                top_ks=torch.full((bs,), mc.vocab_size, device=self.device, dtype=torch.int64),
                min_ps=torch.zeros(bs, device=self.device),
                seeds=torch.zeros(bs, dtype=torch.int64, device=self.device),
                steps=torch.zeros(bs, dtype=torch.int64, device=self.device),
                is_all_greedy=False,
                greedy_mask=torch.zeros(bs, dtype=torch.bool, device=self.device),
                need_top_p_top_k=True,
                need_min_p=False,
            )
            batch.return_logprob = True  # the worst case computes logprobs too
            fb = ForwardBatch.init_new(batch, self)
            self.sample(self.forward(fb), fb)
            del fb
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_reserved() - base
        # A prefill probe may have built buffers the model reserves apart (KT's full-GPU prefill slot over
        # --kt-gpu-prefill-token-threshold): not activations. Freed here; the first real long prompt rebuilds it.
        peak -= self.model.release_reserved_buffers()
        torch.cuda.empty_cache()
        return max(peak, 0)

    # -------------------------------------------------------------- resize
    def post_capture_resize_kv_pool(self: "ModelRunner") -> None:
        measure = envs.SGLANG_POST_CAPTURE_MEASURE_ACTIVATION_PEAK.get()
        peak = self.measure_activation_peak_bytes() if measure else None
        self.readings = dataclasses.replace(
            self.readings,
            activation_peak_bytes=peak,
            free_after_capture_bytes=min(self.all_ranks(self.read_free_memory_bytes())),
        )
        self.pool_size = pool = post_capture_pool_size(self.readings, self.pool_args)
        for warning in pool.warnings:
            logger.warning("%s", warning)
        page, gran = self.server_args.page_size, self.kv_arena.granularity
        backed = backed_bytes_per_buffer(pool.tokens, self.kv_geometry.widest_slot_bytes, page, gran)
        tail = pool.lendable_tail
        self.kv_arena.map_to(backed, tail_bytes_per_buffer=0 if tail is None else tail.bytes_per_buffer)
        self.token_to_kv_pool_allocator.resize(
            pool.tokens, lendable_tail_pages=0 if tail is None else tail.tokens // page
        )
        logger.info("Post-capture KV sizing: max_total_num_tokens=%d", pool.tokens)
        if tail is not None:
            logger.info(
                "KT prefill slot: lent from the pool's last %d tokens (%.3f GiB) while a long prefill runs",
                tail.tokens,
                tail.bytes_per_buffer * self.kv_arena.num_buffers / GiB,
            )

    def release_kv_memory(self: "ModelRunner") -> None:
        """Safe teardown: graphs and pool tensors go first, then the arena unmaps and frees."""
        self.cuda_graph_runner = None
        if self.token_to_kv_pool is not None:
            self.token_to_kv_pool.release_buffers()
        if self.kv_arena is not None:
            self.attn_backend = None
            self.kv_arena.release()
            self.kv_arena = None
