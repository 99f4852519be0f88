"""KV pools for ModelRunner: apply what the planner (pool_configurator.py) decided.

Static path: size the pool from the readings now and allocate it. Post-capture path: reserve
address space now (post_capture_mixin.py), size after capture. Either way the request table is
created once, and the allocator owns the token count (the runner and the scheduler ask it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.pool_configurator import GiB, static_pool_size

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class ModelRunnerKVCacheMixin:
    @property
    def max_total_num_tokens(self: "ModelRunner") -> int:
        return self.token_to_kv_pool_allocator.size

    def init_memory_pool(self: "ModelRunner") -> None:
        if self.sizing_path.post_capture:
            self.reserve_virtual_kv_pool()
            return
        self.pool_size = static_pool_size(self.readings, self.pool_args)
        for warning in self.pool_size.warnings:
            logger.warning("%s", warning)
        self.create_kv_pools(self.pool_size.tokens, self.pool_size.max_running_requests)

    def create_kv_pools(
        self: "ModelRunner", tokens: int, max_running_requests: int, kv_buffers: Optional[Sequence[torch.Tensor]] = None
    ) -> None:
        """The request table, the KV buffers (allocated here unless given) and the allocator over them."""
        mc, sa, kv = self.model_config, self.server_args, self.kv_geometry
        self.req_to_token_pool = ReqToTokenPool(max_running_requests, mc.context_len + 4, self.device)
        if kv.is_mla:
            self.token_to_kv_pool = MLATokenToKVPool(
                tokens,
                page_size=sa.page_size,
                dtype=mc.kv_cache_dtype,
                kv_lora_rank=mc.kv_lora_rank,
                qk_rope_head_dim=mc.qk_rope_head_dim,
                layer_num=kv.num_layers,
                device=self.device,
                buffers=kv_buffers,
            )
        else:
            self.token_to_kv_pool = MHATokenToKVPool(
                tokens,
                page_size=sa.page_size,
                dtype=mc.kv_cache_dtype,
                head_num=kv.kv_heads,
                head_dim=kv.head_dim,
                v_head_dim=kv.v_head_dim,
                layer_num=kv.num_layers,
                device=self.device,
                buffers=kv_buffers,
            )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(tokens, sa.page_size, self.device)
        slots = tokens + sa.page_size
        logger.info(
            "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB",
            tokens,
            slots * kv.k_slot_bytes * kv.num_layers / GiB,
            slots * kv.v_slot_bytes * kv.num_layers / GiB,
        )
