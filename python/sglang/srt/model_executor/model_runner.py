"""ModelRunner: one rank's model, KV pools, attention backend, CUDA graphs, and the memory plan.

Start-up order (each step reads the memory the previous one left; every sizing decision is a pure
function of pool_configurator.py, the KV-cache mixin only applies it):
    distributed init -> free before weights -> load weights -> free after weights -> MemoryReadings
    -> KV pools (static: sized now; post-capture: address space reserved, request table sized)
    -> attention backend -> CUDA graphs -> CaptureReadings (post-capture: measure, size, map, resize)
    -> MemoryPlan.
"""

from __future__ import annotations

import logging
import time
from typing import List, Optional

import torch

from sglang.srt.configs.engine_config import EngineConfig
from sglang.srt.distributed import parallel_state
from sglang.srt.layers.decode_gemm import load_device_table
from sglang.srt.layers.linear import attach_gemm_plans
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.moe.kt_prefill_slot import RESERVATION_NAME, KTPrefillSlot
from sglang.srt.layers.sampler import SampleOutput, Sampler
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.memory_plan import MemoryPlan
from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
from sglang.srt.model_executor.pool_configurator import GiB, MemoryReadings
from sglang.srt.model_loader.loader import get_model
from sglang.srt.utils.cuda_context import set_host_wait
from sglang.srt.utils.memory import get_available_memory_bytes

logger = logging.getLogger(__name__)


class ModelRunner(ModelRunnerKVCacheMixin):
    def __init__(
        self, config: EngineConfig, gpu_id: int = 0, tp_rank: int = 0, dist_init_method: Optional[str] = None
    ) -> None:
        self.config = config
        self.model_config = config.model
        self.device = config.device.kind
        self.gpu_id = gpu_id
        self.tp_rank = tp_rank
        self.tp_size = config.args.tp_size
        self.dist_init_method = dist_init_method
        self.sizing_path = config.memory.path  # decided once, by the resolve step
        self.pool_args = config.memory.pool
        ratio = config.memory.swa_full_tokens_ratio
        self.kv_geometry = config.model.kv_geometry(self.tp_size, tp_rank, ratio)  # this rank's pool layout
        self.cuda_graph_runner = None
        self.kv_arena = None  # the VMM arena of the post-capture path
        self.swa_kv_arena = None  # its second arena: the sliding-window layers' buffers (hybrid SWA pool)
        self.token_to_kv_pool = None  # pools exist once init_memory_pool ran

        self.init_torch_distributed()
        free_before_weights = self.read_free_memory_bytes()
        free_after_weights = self.load_model(free_before_weights)
        self.readings = self.take_memory_readings(free_before_weights, free_after_weights)
        self.init_memory_pool()
        # Each request row's last sampled token, where the next decode step reads its input on the device.
        self.last_sampled_tokens = torch.zeros(self.req_to_token_pool.size, dtype=torch.int64, device=self.device)
        self.sampler = Sampler()
        self.init_attention_backend()
        graph_bytes = self.init_cuda_graphs()
        self.capture_readings = self.finish_memory_pool(graph_bytes)
        self.memory_plan = self.build_memory_plan(free_before_weights - free_after_weights)
        logger.info("%s", self.memory_plan.format_table())

    # ------------------------------------------------------------- readings
    def read_free_memory_bytes(self) -> int:
        """Free device memory on this rank, torch's cache emptied first (the planner's one reading)."""
        return get_available_memory_bytes(self.device, self.gpu_id)

    def read_vmm_granularity(self) -> int:
        """CUDA VMM's physical granularity on this device (the post-capture path's rounding)."""
        from sglang.srt.mem_cache.vmm import allocation_granularity

        return allocation_granularity(self.gpu_id)

    def all_ranks(self, value: int) -> List[int]:
        """`value` as every tensor-parallel rank has it (this rank's alone without TP)."""
        return [int(v) for v in parallel_state.get_tp_group().all_gather_floats(float(value))]

    @property
    def kt_prefill_slot(self) -> Optional[KTPrefillSlot]:
        """The model's KT prefill slot, when it has one (its bytes are the memory plan's reservation)."""
        return self.model.kt_prefill_slot()

    def take_memory_readings(self, free_before_weights: int, free_after_weights: int) -> MemoryReadings:
        """Every rank must size the same pool: free memory is the MIN over ranks, the reservations
        the largest rank's (the KV geometry's largest rank needs no exchange: heads split by rule)."""
        self.per_rank_free_after_weights = self.all_ranks(free_after_weights)
        slot = self.kt_prefill_slot
        reservations = {} if slot is None else {RESERVATION_NAME: max(self.all_ranks(slot.nbytes))}
        return MemoryReadings(
            device_capacity_bytes=self.config.memory.capacity_bytes,
            free_before_weights_bytes=min(self.all_ranks(free_before_weights)),
            free_after_weights_bytes=min(self.per_rank_free_after_weights),
            kv=self.model_config.largest_kv_geometry(self.tp_size, self.config.memory.swa_full_tokens_ratio),
            page_size=self.config.args.page_size,
            reservations_bytes=reservations,
            vmm_granularity_bytes=self.read_vmm_granularity() if self.sizing_path.post_capture else None,
        )

    # ------------------------------------------------------------------ setup
    def init_torch_distributed(self) -> None:
        if self.device == "cuda":
            if self.config.kt is not None:
                # KT experts on the CPU: while this thread waits for the GPU, the expert threads need its core
                # (a polling wait took cores from them: benchmark/kt_decode/).
                set_host_wait(self.gpu_id, "block")
            torch.cuda.set_device(self.gpu_id)
            torch.cuda.init()
        if self.tp_size > 1:
            backend = "nccl" if self.device == "cuda" else "gloo"
            parallel_state.init_distributed_environment(
                backend, self.tp_size, self.tp_rank, self.dist_init_method, local_rank=self.gpu_id
            )
        parallel_state.initialize_model_parallel(self.tp_size)

    def load_model(self, free_before: int) -> int:
        """Build and fill the model; returns the free memory after it (this rank's reading)."""
        start = time.perf_counter()
        args = self.config.args
        logger.info("Load weight begin. avail mem=%.2f GB", free_before / GiB)
        torch.manual_seed(args.random_seed)
        self.model = get_model(self.model_config, args.load_format, self.device, self.config.kt, args.random_seed)
        if self.device == "cuda":
            device_name = torch.cuda.get_device_name(self.gpu_id)
            plans = load_device_table(device_name, self.config.kernels.decode_gemm_config_dir)
            tuned = attach_gemm_plans(self.model, plans)
            logger.info("Decode GEMMs: %d linear layers use the skinny kernel tuned for %s", tuned, device_name)
        free_after = self.read_free_memory_bytes()
        logger.info(
            "Load weight end. type=%s, dtype=%s, avail mem=%.2f GB, mem usage=%.2f GB, elapsed %.1f s",
            type(self.model).__name__,
            self.model_config.dtype,
            free_after / GiB,
            (free_before - free_after) / GiB,
            time.perf_counter() - start,
        )
        return free_after

    def init_attention_backend(self) -> None:
        if self.config.kernels.attention_backend == "triton":
            from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

            self.attn_backend = TritonAttnBackend(self)
        else:
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            self.attn_backend = TorchNativeAttnBackend(self)

    def init_cuda_graphs(self) -> int:
        """Capture the decode graphs (CUDA); returns the device memory they took (0 without graphs)."""
        kernels = self.config.kernels
        if not kernels.cuda_graphs:
            return 0
        if not self.attn_backend.supports_cuda_graph:
            logger.warning(
                "CUDA graphs disabled: the %s attention backend cannot be captured", kernels.attention_backend
            )
            return 0
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

        start, before = time.perf_counter(), self.read_free_memory_bytes()
        try:
            self.cuda_graph_runner = CudaGraphRunner(self)
        except RuntimeError as e:
            # Decode still works eagerly (e.g. a driver that cannot capture the KT CPU experts' host functions).
            logger.warning("CUDA graph capture failed, decode runs eagerly: %s", e)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return 0
        after = self.read_free_memory_bytes()
        logger.info(
            "Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB. bs=%s",
            time.perf_counter() - start,
            (before - after) / GiB,
            after / GiB,
            self.cuda_graph_runner.capture_bs,
        )
        return max(before - after, 0)

    @property
    def captured_graph_max_bs(self) -> int:
        return 0 if self.cuda_graph_runner is None else self.cuda_graph_runner.max_bs

    def build_memory_plan(self, weights_bytes: int) -> MemoryPlan:
        """The report, once everything is allocated."""
        notes = []
        if self.sizing_path.post_capture and self.device == "cuda" and self.cuda_graph_runner is None:
            notes.append(
                "decode runs eagerly (no CUDA graphs); the measured eager decode at max_running_requests "
                "sets the headroom"
            )
        swa = self.config.memory.swa_pool
        if self.model_config.num_window_layers and swa.swa_full_tokens_ratio is None:
            notes.append(f"sliding-window layers keep every token in the one pool: {swa.reason}")
        kernels = self.config.kernels
        return MemoryPlan.report(
            self.readings,
            self.capture_readings,
            self.pool_size,
            self.sizing_path,
            self.pool_args,
            device=self.device,
            tp_size=self.tp_size,
            weights_bytes=weights_bytes,
            per_rank_free_after_weights_bytes=self.per_rank_free_after_weights,
            req_to_token_bytes=self.req_to_token_pool.nbytes(),
            cuda_graph_max_bs=kernels.cuda_graph_max_bs if kernels.cuda_graphs else 0,
            free_after_start_up_bytes=self.read_free_memory_bytes(),
            notes=notes,
        )

    # ---------------------------------------------------------------- forward
    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(self, logits_output: LogitsProcessorOutput, forward_batch: ForwardBatch) -> SampleOutput:
        """Token ids and, when some request asked for them, their logprobs (and the top-k / chosen ids').
        The ids are also stored at their request rows, the next decode step's inputs."""
        fb = forward_batch
        out = self.sampler(logits_output.next_token_logits, fb.sampling_info, fb.return_logprob)
        self.last_sampled_tokens[fb.req_pool_indices] = out.next_token_ids
        return out

    def shutdown(self) -> None:
        self.release_kv_memory()
