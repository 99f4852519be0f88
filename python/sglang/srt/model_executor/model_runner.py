"""ModelRunner: one rank's model, KV pools, attention backend, CUDA graphs, and the memory plan.

Start-up order (each step reads the memory the previous one left):
    distributed init -> pre_model_load_memory -> load weights -> KV pools -> attention backend
    -> CUDA graphs -> (post-capture resize) -> final plan.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Tuple

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import parallel_state
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.memory_plan import MemoryPlan
from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
from sglang.srt.model_executor.post_capture_mixin import PostCaptureKVSizingMixin
from sglang.srt.model_loader.loader import get_model
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.memory import get_available_memory_gb, get_device_memory_capacity

logger = logging.getLogger(__name__)


class ModelRunner(ModelRunnerKVCacheMixin, PostCaptureKVSizingMixin):
    def __init__(
        self,
        model_config: ModelConfig,
        server_args: ServerArgs,
        gpu_id: int = 0,
        tp_rank: int = 0,
        tp_size: int = 1,
        dist_init_method: Optional[str] = None,
    ) -> None:
        self.model_config = model_config
        self.server_args = server_args
        self.device = server_args.device
        self.gpu_id = gpu_id
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.dist_init_method = dist_init_method
        self.memory_plan = MemoryPlan(
            device=self.device,
            tp_size=tp_size,
            mem_fraction_static=server_args.mem_fraction_static,
            device_capacity_gb=get_device_memory_capacity(self.device, gpu_id) / 1024,
            cuda_graph_max_bs=0 if server_args.disable_cuda_graph else server_args.cuda_graph_max_bs,
        )
        self.post_capture_planned = self.decide_post_capture_path()
        self.cuda_graph_runner = None
        self.kv_arena = None  # the VMM arena of the post-capture path
        self.token_to_kv_pool = None  # pools exist once init_memory_pool ran

        self.init_torch_distributed()
        self.memory_plan.pre_model_load_memory_gb = self.min_over_ranks(
            self.read_available_memory_gb(), "pre_model_load_memory_gb"
        )
        self.load_model()
        self.init_memory_pool()
        self.sampler = Sampler()
        self.init_attention_backend()
        self.init_cuda_graphs()
        if self.post_capture_planned:
            self.post_capture_resize_kv_pool()
        self.memory_plan.free_after_plan_gb = self.read_available_memory_gb()
        logger.info("%s", self.memory_plan.format_table())

    # ------------------------------------------------------------------ setup
    def read_available_memory_gb(self) -> float:
        return get_available_memory_gb(self.device, self.gpu_id)

    def min_over_ranks(self, value: float, what: str) -> float:
        """Every rank must size the same pool: planner readings are the MIN over tensor-parallel ranks."""
        readings = parallel_state.get_tp_group().all_gather_floats(value)
        if what == "available_after_weights_gb":
            self.memory_plan.per_rank_available_gb = readings
        return min(readings)

    def init_torch_distributed(self) -> None:
        if self.device == "cuda":
            torch.cuda.set_device(self.gpu_id)
            torch.cuda.init()
        if self.tp_size > 1:
            backend = "nccl" if self.device == "cuda" else "gloo"
            parallel_state.init_distributed_environment(
                backend, self.tp_size, self.tp_rank, self.dist_init_method, local_rank=self.gpu_id
            )
        parallel_state.initialize_model_parallel(self.tp_size)

    def load_model(self) -> None:
        start = time.perf_counter()
        before = self.read_available_memory_gb()
        logger.info("Load weight begin. avail mem=%.2f GB", before)
        torch.manual_seed(self.server_args.random_seed)
        self.model = get_model(
            self.model_config,
            self.server_args.load_format,
            self.device,
            seed=self.server_args.random_seed,
            **self.model_extra_kwargs(),
        )
        after = self.read_available_memory_gb()
        self.memory_plan.weights_gb = before - after
        self.register_model_reservations()
        logger.info(
            "Load weight end. type=%s, dtype=%s, avail mem=%.2f GB, mem usage=%.2f GB, elapsed %.1f s",
            type(self.model).__name__, self.model_config.dtype, after, before - after, time.perf_counter() - start,
        )

    def model_extra_kwargs(self) -> dict:
        """Keyword arguments only some model classes take (the KT wrapper's settings for MoE models)."""
        if self.model_config.is_moe:
            return {"server_args": self.server_args}
        return {}

    def register_model_reservations(self) -> None:
        """Bytes that MoE layers ask to keep out of the KV pool (the KT full-GPU prefill slot)."""
        for name, nbytes in self.model.memory_reservations().items():
            self.memory_plan.reservations_bytes[name] = int(nbytes)

    def init_attention_backend(self) -> None:
        backend = self.server_args.attention_backend
        if backend == "triton":
            from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

            self.attn_backend = TritonAttnBackend(self)
        else:
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            self.attn_backend = TorchNativeAttnBackend(self)

    def init_cuda_graphs(self) -> None:
        if self.server_args.disable_cuda_graph or self.device != "cuda":
            return
        if self.model.needs_host_work_per_forward():
            logger.warning("CUDA graphs disabled: some MoE experts run on the CPU (--kt-num-gpu-experts < experts)")
            return
        if not self.attn_backend.supports_cuda_graph:
            logger.warning("CUDA graphs disabled: the %s attention backend cannot be captured", self.server_args.attention_backend)
            return
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

        before = self.read_available_memory_gb()
        self.cuda_graph_runner = CudaGraphRunner(self)
        after = self.read_available_memory_gb()
        self.memory_plan.cuda_graph_gb = max(before - after, 0.0)

    # ---------------------------------------------------------------- forward
    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(
        self, logits_output: LogitsProcessorOutput, forward_batch: ForwardBatch
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(token ids, their logprobs when some request asked for them, else None)."""
        return self.sampler(logits_output.next_token_logits, forward_batch.sampling_info, forward_batch.return_logprob)

    def shutdown(self) -> None:
        self.release_kv_memory()
