"""Post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1).

Before graph capture: reserve the KV pool as CUDA virtual memory (one range per layer's K and V,
sized for every token free memory could hold) and back only the first granule of each range, the
dummy slot that padded graph rows write to. After capture: measure what is really free, keep the
headroom, and back exactly the rest with physical memory behind the same addresses. Graph memory
and activations are then measured, not guessed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.environ import envs
from sglang.srt.model_executor.memory_plan import GiB
from sglang.srt.model_executor.model_runner_kv_cache_mixin import NotEnoughMemoryError

if TYPE_CHECKING:
    from sglang.srt.mem_cache.vmm import VirtualKVArena
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)
MiB = 1 << 20
# Kept on top of the measured activation peak: allocator rounding/fragmentation and per-step index tensors.
ACTIVATION_SAFETY_MARGIN_BYTES = 256 * MiB
ACTIVATION_SAFETY_FRACTION = 0.10


class PostCaptureKVSizingMixin:
    kv_arena: Optional["VirtualKVArena"]

    def decide_post_capture_path(self: "ModelRunner") -> bool:
        plan = self.memory_plan
        blockers = self.server_args.post_capture_kv_sizing_blockers()
        sa, hf = self.server_args, self.model_config.hf_config
        num_experts = getattr(hf, "num_experts", 0) or 0
        if sa.kt_num_gpu_experts is not None and sa.kt_num_gpu_experts < num_experts and not blockers:
            # No graphs to wait for, but sizing after the measured eager peak still beats the static guess.
            plan.notes.append("KT experts on the CPU: decode runs eagerly (no CUDA graphs); the measured eager "
                              "decode at max_running_requests sets the headroom")
        if blockers:
            plan.path, plan.path_reason = "static", "; ".join(blockers)
            return False
        from sglang.srt.mem_cache.vmm import vmm_supported

        ok, why = vmm_supported(self.gpu_id)
        if not ok:
            # mem_fraction_static was chosen for the post-capture path: say so loudly.
            plan.path, plan.path_reason = "static", f"CUDA VMM unavailable: {why}"
            logger.warning("Post-capture KV sizing requested but %s; using static sizing", why)
            return False
        plan.path, plan.path_reason = "post-capture", "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1"
        return True

    # ------------------------------------------------------------- reserve
    def _slot_bytes(self: "ModelRunner") -> tuple[int, int]:
        mc = self.model_config
        item = torch.empty((), dtype=mc.kv_cache_dtype).element_size()
        heads = mc.get_num_kv_heads(self.tp_size, self.tp_rank)
        return heads * mc.head_dim * item, heads * mc.v_head_dim * item

    def init_memory_pool_post_capture(self: "ModelRunner") -> None:
        from sglang.srt.mem_cache.vmm import VirtualKVArena

        plan, sa, mc = self.memory_plan, self.server_args, self.model_config
        page = sa.page_size
        available = self.min_over_ranks(self.read_available_memory_gb(), "available_after_weights_gb")
        plan.available_after_weights_gb = available
        plan.static_equivalent_tokens = self._static_equivalent_tokens(available)
        # Virtual upper bound: every free byte as KV (address space is cheap, nothing is backed).
        upper = int(self.min_over_ranks(int(available * GiB) // plan.cell_size_bytes // page * page, "tokens"))
        if sa.max_total_tokens is not None:
            upper = min(upper, sa.max_total_tokens // page * page)
        if upper <= 0:
            raise NotEnoughMemoryError("no free memory for a KV cache after loading the weights")
        k_slot, v_slot = self._slot_bytes()
        self.kv_va_upper_bound_tokens = upper
        reserve = (upper + page) * max(k_slot, v_slot)
        self.kv_arena = VirtualKVArena(2 * mc.num_hidden_layers, reserve, self.gpu_id)
        heads = mc.get_num_kv_heads(self.tp_size, self.tp_rank)
        store = torch.uint8 if mc.kv_cache_dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else mc.kv_cache_dtype
        buffers = []
        for layer in range(mc.num_hidden_layers):
            buffers.append(self.kv_arena.tensor(2 * layer, store, (upper + page, heads, mc.head_dim)))
            buffers.append(self.kv_arena.tensor(2 * layer + 1, store, (upper + page, heads, mc.v_head_dim)))
        # The request table is captured by the graphs, so its size is decided now, from the bound.
        max_num_reqs = self.decide_max_running_requests(upper)
        initial = max(page, min(upper, (self.kv_arena.mapped_bytes_per_buffer // max(k_slot, v_slot)) // page * page - page))
        self._create_pools(initial, max_num_reqs, kv_buffers=buffers)
        logger.info(
            "Post-capture KV sizing: reserved %d layers x 2 ranges of %.2f GB of address space (<= %d tokens); "
            "%d tokens backed until capture", mc.num_hidden_layers, reserve / GiB, upper, initial,
        )

    def _static_equivalent_tokens(self: "ModelRunner", available_gb: float) -> int:
        """What the classic path would size from the same readings (its default mem_fraction_static)."""
        sa, plan = self.server_args, self.memory_plan
        mfs = sa.static_path_mem_fraction_static()
        rest = available_gb - plan.pre_model_load_memory_gb * (1 - mfs) - self.reserved_bytes() / GiB
        tokens = int(rest * GiB) // plan.cell_size_bytes // sa.page_size * sa.page_size
        return max(0, min(tokens, sa.max_total_tokens or tokens))

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
            ModelWorkerBatch(ForwardMode.EXTEND, [1] * chunk, [0] * n_prefill, ext,
                             torch.zeros(chunk, dtype=torch.int64), extend_seq_lens=ext, extend_prefix_lens=[0] * n_prefill),
            ModelWorkerBatch(ForwardMode.DECODE, [1] * max_reqs, [0] * max_reqs, [1] * max_reqs,
                             torch.zeros(max_reqs, dtype=torch.int64)),
        ]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        for batch in probes:
            bs = len(batch.seq_lens)
            batch.sampling_info = SamplingBatchInfo(
                temperatures=torch.ones(bs, 1, device=self.device), top_ps=torch.full((bs,), 0.9, device=self.device),
                top_ks=torch.full((bs,), mc.vocab_size, device=self.device, dtype=torch.int64),
                min_ps=torch.zeros(bs, device=self.device), seeds=torch.zeros(bs, dtype=torch.int64, device=self.device),
                steps=torch.zeros(bs, dtype=torch.int64, device=self.device), is_all_greedy=False,
                greedy_mask=torch.zeros(bs, dtype=torch.bool, device=self.device), need_top_p_top_k=True, need_min_p=False,
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

    def post_capture_headroom_bytes(self: "ModelRunner", measured_peak: Optional[int]) -> tuple[int, int, str]:
        """(headroom we keep, headroom by SGLang's rule alone, the rule applied).

        SGLang's rule: the minimal pre_model_load_memory * (1 - mem_fraction_static), floored to the
        generic activation reserve when decode runs eagerly above the captured batch size. We
        measured the worst case instead (a full chunked prefill and an eager decode at
        max_running_requests, each sampled), so with a measurement the guess is replaced by the
        measured peak plus a margin; without one (SGLANG_POST_CAPTURE_MEASURE_ACTIVATION_PEAK=0) we
        keep SGLang's rule.
        """
        plan, sa = self.memory_plan, self.server_args
        minimal = plan.pre_model_load_memory_gb * (1 - plan.mem_fraction_static) * GiB
        sglang_rule, rule = minimal, "pre_model_load_memory * (1 - mem_fraction_static)"
        max_reqs = self.req_to_token_pool.size
        graph_bs = 0 if self.cuda_graph_runner is None else self.cuda_graph_runner.max_bs
        if graph_bs < max_reqs:
            floor = sa.pre_capture_activation_reserve_mb() * MiB
            logger.warning(
                "Decode runs eagerly above the captured batch size (cuda_graph_max_bs=%d < max_running_requests=%d); "
                "SGLang's rule would keep the activation reserve of %.0f MiB%s", graph_bs, max_reqs, floor / MiB,
                "" if measured_peak is None else f", the measured worst case needs {measured_peak / MiB:.0f} MiB",
            )
            if floor > sglang_rule:
                sglang_rule = floor
                rule = f"activation reserve (cuda_graph_max_bs {graph_bs} < max_running_requests {max_reqs})"
        if measured_peak is None:
            return int(sglang_rule), int(sglang_rule), rule
        # The measurement replaces both guesses, the activation reserve and the minimal headroom
        # (which exists to cover unmeasured activations).
        needed = measured_peak * (1 + ACTIVATION_SAFETY_FRACTION) + ACTIVATION_SAFETY_MARGIN_BYTES
        return int(needed), int(sglang_rule), "measured activation peak + 10% + 256 MiB"

    # -------------------------------------------------------------- resize
    def _tokens_for_budget(self: "ModelRunner", budget_bytes: int) -> int:
        """Tokens a KV budget holds on this rank, aligned to pages and to the granularity (rounded down)."""
        page, gran = self.server_args.page_size, self.kv_arena.granularity
        k_slot, v_slot = self._slot_bytes()
        tokens = max(budget_bytes, 0) // self.memory_plan.cell_size_bytes // page * page
        tokens = min(tokens, self.kv_va_upper_bound_tokens)
        per_buffer = (tokens + page) * max(k_slot, v_slot) // gran * gran  # round down: stay inside the budget
        return min(self.token_to_kv_pool.capacity_for_backed_bytes(per_buffer), self.kv_va_upper_bound_tokens)

    def _bytes_per_buffer(self: "ModelRunner", tokens: int) -> int:
        gran = self.kv_arena.granularity
        k_slot, v_slot = self._slot_bytes()
        return -(-(tokens + self.server_args.page_size) * max(k_slot, v_slot) // gran) * gran

    def post_capture_resize_kv_pool(self: "ModelRunner") -> None:
        plan, sa = self.memory_plan, self.server_args
        measured = self.measure_activation_peak_bytes() if envs.SGLANG_POST_CAPTURE_MEASURE_ACTIVATION_PEAK.get() else None
        plan.activation_peak_gb = (measured or 0) / GiB
        free = self.min_over_ranks(self.read_available_memory_gb(), "free_after_capture_gb") * GiB
        headroom, sglang_headroom, rule = self.post_capture_headroom_bytes(measured)
        backed = self.kv_arena.mapped_bytes_per_buffer * self.kv_arena.num_buffers
        reserved = self.reserved_bytes()
        plan.post_capture_budget_bytes = int(free - headroom + backed)
        # Every rank must size the same pool (ranks may hold different numbers of KV heads).
        tokens = int(self.min_over_ranks(self._tokens_for_budget(plan.post_capture_budget_bytes - reserved), "tokens"))
        plan.sglang_rule_tokens = int(self.min_over_ranks(
            self._tokens_for_budget(int(free - sglang_headroom - reserved + backed)), "tokens"
        ))
        if sa.max_total_tokens is not None and sa.max_total_tokens < tokens:
            plan.token_cap_reason = f"--max-total-tokens {sa.max_total_tokens} (memory allows {tokens})"
            tokens = sa.max_total_tokens // sa.page_size * sa.page_size
        if tokens <= 0:
            raise NotEnoughMemoryError(
                f"Post-capture KV sizing found no room for the KV cache: {free / GiB:.2f} GiB free, "
                f"headroom {headroom / GiB:.2f} GiB, reservations {reserved / GiB:.2f} GiB. "
                f"Lower --max-running-requests or --chunked-prefill-size, or free device memory."
            )
        self.kv_arena.map_to(max(self._bytes_per_buffer(tokens), self.kv_arena.mapped_bytes_per_buffer))
        self.token_to_kv_pool.resize(tokens)
        self.token_to_kv_pool_allocator.resize(tokens)
        self.max_total_num_tokens = tokens
        plan.headroom_gb, plan.headroom_rule = headroom / GiB, rule
        self.record_pool_size()
        logger.info("Post-capture KV sizing: max_total_num_tokens=%d", tokens)

    def release_kv_memory(self: "ModelRunner") -> None:
        """Safe teardown: graphs and pool tensors go first, then the arena unmaps and frees."""
        self.cuda_graph_runner = None
        if self.token_to_kv_pool is not None:
            self.token_to_kv_pool.release_buffers()
        if self.kv_arena is not None:
            self.attn_backend = None
            self.kv_arena.release()
            self.kv_arena = None
