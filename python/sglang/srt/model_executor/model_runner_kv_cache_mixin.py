"""KV-cache sizing and pool creation for ModelRunner (the static path; post-capture lives beside it).

Static path, as SGLang does it: after the weights are loaded,
    rest = available - pre_model_load_memory * (1 - mem_fraction_static) - reservations
    max_total_num_tokens = rest_bytes // cell_size, rounded down to a multiple of page_size.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.memory_plan import GiB

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class NotEnoughMemoryError(RuntimeError):
    pass


class ModelRunnerKVCacheMixin:
    # ------------------------------------------------------------------ sizing
    def kv_cell_size(self: "ModelRunner") -> int:
        """KV bytes per token on this rank: kv_heads * (head_dim + v_head_dim) * layers * dtype bytes."""
        mc = self.model_config
        dtype_bytes = torch.empty((), dtype=mc.kv_cache_dtype).element_size()
        return mc.get_num_kv_heads(self.tp_size, self.tp_rank) * (mc.head_dim + mc.v_head_dim) * mc.num_hidden_layers * dtype_bytes

    def reserved_bytes(self: "ModelRunner") -> int:
        """Everything reserved outside the KV pool (e.g. the KT full-GPU prefill slot), per rank."""
        return sum(self.memory_plan.reservations_bytes.values())

    def profile_max_num_token(self: "ModelRunner") -> int:
        plan = self.memory_plan
        available = self.min_over_ranks(self.read_available_memory_gb(), "available_after_weights_gb")
        plan.available_after_weights_gb = available
        plan.headroom_gb = plan.pre_model_load_memory_gb * (1 - plan.mem_fraction_static)
        plan.headroom_rule = "pre_model_load_memory * (1 - mem_fraction_static)"
        # Reservations are exact byte counts: subtract them as integers.
        rest_bytes = int((available - plan.headroom_gb) * GiB) - self.reserved_bytes()
        return rest_bytes // plan.cell_size_bytes

    def finish_token_count(self: "ModelRunner", tokens: int) -> int:
        """Apply --max-total-tokens and page alignment; refuse a pool with no room."""
        sa = self.server_args
        if sa.max_total_tokens is not None:
            if sa.max_total_tokens > tokens:
                logger.warning(
                    "--max-total-tokens %d is larger than the memory allows (%d); using %d",
                    sa.max_total_tokens, tokens, tokens,
                )
            elif sa.max_total_tokens < tokens:
                self.memory_plan.token_cap_reason = f"--max-total-tokens {sa.max_total_tokens} (memory allows {tokens})"
                tokens = sa.max_total_tokens
        tokens = tokens // sa.page_size * sa.page_size
        if tokens <= 0:
            raise NotEnoughMemoryError(
                f"Not enough memory for the KV cache (max_total_num_tokens={tokens}). "
                f"Increase --mem-fraction-static (now {self.memory_plan.mem_fraction_static}) or free device memory."
            )
        return tokens

    def decide_max_running_requests(self: "ModelRunner", tokens: int) -> int:
        sa = self.server_args
        if sa.max_running_requests is not None:
            return sa.max_running_requests
        return min(max(int(tokens / self.model_config.context_len * 512), 2048), 4096)

    # ---------------------------------------------------------------- pools
    def init_memory_pool(self: "ModelRunner") -> None:
        plan = self.memory_plan
        plan.cell_size_bytes = self.kv_cell_size()
        plan.page_size = self.server_args.page_size
        if self.post_capture_planned:
            self.init_memory_pool_post_capture()
            return
        # Ranks may hold different numbers of KV heads (uneven splits): all take the smallest count.
        tokens = int(self.min_over_ranks(self.profile_max_num_token(), "max_total_num_tokens"))
        tokens = self.finish_token_count(tokens)
        self._create_pools(tokens, self.decide_max_running_requests(tokens))

    def _create_pools(self: "ModelRunner", tokens: int, max_num_reqs: int, kv_buffers=None) -> None:
        mc, sa, plan = self.model_config, self.server_args, self.memory_plan
        self.max_total_num_tokens = tokens
        self.req_to_token_pool = ReqToTokenPool(max_num_reqs, mc.context_len + 4, self.device)
        self.token_to_kv_pool = MHATokenToKVPool(
            tokens,
            page_size=sa.page_size,
            dtype=mc.kv_cache_dtype,
            head_num=mc.get_num_kv_heads(self.tp_size, self.tp_rank),
            head_dim=mc.head_dim,
            v_head_dim=mc.v_head_dim,
            layer_num=mc.num_hidden_layers,
            device=self.device,
            buffers=kv_buffers,
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(tokens, sa.page_size, self.device)
        plan.max_total_num_tokens = tokens
        plan.max_running_requests = max_num_reqs
        plan.req_to_token_gb = self.req_to_token_pool.nbytes() / GiB
        self.record_pool_size()
        k_bytes, v_bytes = self.token_to_kv_pool.get_kv_size_bytes()
        logger.info(
            "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB", tokens, k_bytes / GiB, v_bytes / GiB
        )

    def record_pool_size(self: "ModelRunner") -> None:
        plan = self.memory_plan
        plan.max_total_num_tokens = self.max_total_num_tokens
        plan.kv_pool_gb = self.max_total_num_tokens * plan.cell_size_bytes / GiB
