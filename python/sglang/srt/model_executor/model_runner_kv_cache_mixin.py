"""KV pools for ModelRunner: both sizing paths applied here, as the planner (pool_configurator.py) decided.

Static path: size the pool from the readings now and allocate it. Post-capture path
(SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1): before graph capture, reserve the KV pool as CUDA virtual
memory (one range per layer's K and V, sized for every token free memory could hold) and back only the
first granule of each range, the dummy slot that padded graph rows write to; after capture, measure
the worst-case activation peak and what is really free, let post_capture_pool_size decide, and back
exactly that much with physical memory behind the same addresses. With the hybrid SWA pool the sliding-window
layers' buffers are a second arena, reserved and backed for the window pool's tokens. Either way the request table
is created once, and the allocator owns the token count (the runner and the scheduler ask it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool, kv_storage_dtype
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor import activation_probe
from sglang.srt.model_executor.pool_configurator import (
    CaptureReadings,
    GiB,
    PoolSize,
    backed_bytes_per_buffer,
    post_capture_pool_size,
    static_pool_size,
    tokens_backed_before_capture,
    virtual_pool,
)

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class ModelRunnerKVCacheMixin:
    pool_size: PoolSize  # the planner's decision (static: at init_memory_pool; post-capture: after the resize)

    @property
    def max_total_num_tokens(self: "ModelRunner") -> int:
        return self.token_to_kv_pool_allocator.size

    # ------------------------------------------------------------ before capture
    def init_memory_pool(self: "ModelRunner") -> None:
        if self.sizing_path.post_capture:
            self.reserve_virtual_kv_pool()
            return
        self.pool_size = static_pool_size(self.readings, self.pool_args)
        for warning in self.pool_size.warnings:
            logger.warning("%s", warning)
        self.create_kv_pools(self.pool_size.tokens, self.pool_size.max_running_requests)

    def reserve_virtual_kv_pool(self: "ModelRunner") -> None:
        """Post-capture: reserve address space for the pool's upper bound, back only the first granule."""
        from sglang.srt.mem_cache.vmm import VirtualKVArena

        pool = virtual_pool(self.readings, self.pool_args)
        kv, page = self.kv_geometry, self.config.args.page_size
        store = kv_storage_dtype(self.model_config.kv_cache_dtype)

        def reserve(num_buffers: int, reserve_bytes: int, tokens: int) -> tuple[VirtualKVArena, list[torch.Tensor]]:
            """An arena of `num_buffers` ranges and the pool's tensors over them (K, V per layer; MLA: the latent)."""
            arena, slots = VirtualKVArena(num_buffers, reserve_bytes, self.gpu_id), tokens + page
            if kv.is_mla:
                return arena, [arena.tensor(i, store, (slots, 1, kv.head_dim)) for i in range(num_buffers)]
            widths = (kv.head_dim, kv.v_head_dim) * (num_buffers // 2)
            return arena, [arena.tensor(i, store, (slots, kv.kv_heads, w)) for i, w in enumerate(widths)]

        self.kv_arena, buffers = reserve(kv.full_buffers, pool.reserve_bytes_per_buffer, pool.max_tokens)
        swa_buffers = None
        if kv.is_hybrid_swa:
            swa_max = kv.swa_tokens(pool.max_tokens, page)
            self.swa_kv_arena, swa_buffers = reserve(kv.swa_buffers, pool.swa_reserve_bytes_per_buffer, swa_max)
        initial = tokens_backed_before_capture(self.readings, pool)
        self.create_kv_pools(
            initial,
            pool.max_running_requests,
            kv_buffers=buffers,
            swa_kv_buffers=swa_buffers,
            max_tokens=pool.max_tokens,
        )
        logger.info(
            "Post-capture KV sizing: reserved %d layers x %d ranges of %.2f GB of address space (<= %d tokens)%s; "
            "%d tokens backed until capture",
            kv.full_layers,
            kv.num_buffers // kv.num_layers,
            self.kv_arena.reserved_bytes_per_buffer / GiB,
            pool.max_tokens,
            ""
            if swa_buffers is None
            else f", {kv.swa_layers} sliding-window layers x {kv.num_buffers // kv.num_layers} ranges of "
            f"{self.swa_kv_arena.reserved_bytes_per_buffer / GiB:.2f} GB",
            initial,
        )

    def create_kv_pools(
        self: "ModelRunner",
        tokens: int,
        max_running_requests: int,
        kv_buffers: Optional[Sequence[torch.Tensor]] = None,
        swa_kv_buffers: Optional[Sequence[torch.Tensor]] = None,
        max_tokens: Optional[int] = None,
    ) -> None:
        """The request table, the KV buffers (allocated here unless given: the post-capture path's ranges, for a
        pool that may grow to `max_tokens`; `swa_kv_buffers` the windowed layers') and the allocator over them."""
        mc, page, kv = self.model_config, self.config.args.page_size, self.kv_geometry
        self.req_to_token_pool = ReqToTokenPool(max_running_requests, mc.context_len, self.device)

        def mha_pool(size: int, layers: int, buffers: Optional[Sequence[torch.Tensor]] = None) -> MHATokenToKVPool:
            return MHATokenToKVPool(
                size,
                page_size=page,
                dtype=mc.kv_cache_dtype,
                head_num=kv.kv_heads,
                head_dim=kv.head_dim,
                v_head_dim=kv.v_head_dim,
                layer_num=layers,
                device=self.device,
                buffers=buffers,
            )

        if kv.is_mla:  # one latent row (kv_lora_rank + qk_rope_head_dim) per token and layer
            self.token_to_kv_pool = MLATokenToKVPool(
                tokens,
                page_size=page,
                dtype=mc.kv_cache_dtype,
                kv_lora_rank=mc.kv_lora_rank,
                qk_rope_head_dim=mc.qk_rope_head_dim,
                layer_num=kv.num_layers,
                device=self.device,
                buffers=kv_buffers,
            )
        elif kv.is_hybrid_swa:  # sliding-window layers in their own, smaller pool
            swa_tokens = kv.swa_tokens(tokens, page)
            self.token_to_kv_pool_allocator = SWATokenToKVPoolAllocator(
                tokens, swa_tokens, page, self.device, max_size=max_tokens
            )
            self.token_to_kv_pool = SWAKVPool(
                mha_pool(tokens, kv.full_layers, kv_buffers),
                mha_pool(swa_tokens, kv.swa_layers, swa_kv_buffers),
                layer_windows=mc.sliding_windows,
                full_to_swa=self.token_to_kv_pool_allocator.full_to_swa,
            )
            logger.info(
                "Hybrid SWA KV pool: %d full-attention layers x %d tokens, %d sliding-window layers x %d tokens "
                "(window %d), %.2f GB",
                kv.full_layers,
                tokens,
                kv.swa_layers,
                swa_tokens,
                mc.max_sliding_window,
                ((tokens + page) * kv.full_layers + (swa_tokens + page) * kv.swa_layers) * kv.layer_cell_bytes / GiB,
            )
            return
        else:
            self.token_to_kv_pool = mha_pool(tokens, kv.num_layers, kv_buffers)
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(tokens, page, self.device)
        slots = tokens + page
        logger.info(
            "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB",
            tokens,
            slots * kv.k_slot_bytes * kv.num_layers / GiB,
            slots * kv.v_slot_bytes * kv.num_layers / GiB,
        )

    # ------------------------------------------------------------- after capture
    def finish_memory_pool(self: "ModelRunner", graph_bytes: int) -> CaptureReadings:
        """What capture measured; on the post-capture path also the probe's peak and the free memory, then the
        pool is sized, backed and resized."""
        if not self.sizing_path.post_capture:
            return CaptureReadings(graph_bytes=graph_bytes, captured_graph_max_bs=self.captured_graph_max_bs)
        capture = CaptureReadings(
            graph_bytes=graph_bytes,
            captured_graph_max_bs=self.captured_graph_max_bs,
            activation_peak_bytes=self.measure_activation_peak_bytes(),
            free_after_capture_bytes=min(self.all_ranks(self.read_free_memory_bytes())),
        )
        self.pool_size = pool = post_capture_pool_size(self.readings, capture, self.pool_args)
        for warning in pool.warnings:
            logger.warning("%s", warning)
        page, gran, kv = self.config.args.page_size, self.kv_arena.granularity, self.kv_geometry
        backed = backed_bytes_per_buffer(pool.tokens, kv.widest_slot_bytes, page, gran)
        tail = pool.prefill_slot_tail
        self.kv_arena.map_to(backed, tail_bytes_per_buffer=0 if tail is None else tail.bytes_per_buffer)
        if kv.is_hybrid_swa:  # no tail: can_lend_reservations refuses a hybrid pool
            swa_tokens = kv.swa_tokens(pool.tokens, page)
            self.swa_kv_arena.map_to(backed_bytes_per_buffer(swa_tokens, kv.widest_slot_bytes, page, gran))
            self.token_to_kv_pool_allocator.resize(pool.tokens, swa_tokens)
            logger.info(
                "Post-capture KV sizing: max_total_num_tokens=%d, sliding-window layers' pool %d tokens",
                pool.tokens,
                swa_tokens,
            )
            return capture
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
        return capture

    def measure_activation_peak_bytes(self: "ModelRunner") -> Optional[int]:
        """The worst-case eager forwards' peak (activation_probe.py)."""
        return activation_probe.measure_activation_peak_bytes(self)

    # --------------------------------------------------------------- teardown
    def release_kv_memory(self: "ModelRunner") -> None:
        """Safe teardown of either path: graphs and pool tensors go first, then the arena unmaps and frees."""
        self.cuda_graph_runner = None
        if self.token_to_kv_pool is not None:
            self.token_to_kv_pool.release_buffers()
        if self.kv_arena is not None:
            self.attn_backend = None
            self.kv_arena.release()
            self.kv_arena = None
        if self.swa_kv_arena is not None:
            self.swa_kv_arena.release()
            self.swa_kv_arena = None
