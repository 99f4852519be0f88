"""ServerArgs: every flag of `python -m sglang.launch_server`, SGLang's names and defaults.

Defaults that depend on the machine (device, chunked prefill size, CUDA-graph batch sizes, the KV
sizing path, mem_fraction_static) are resolved in `__post_init__`, exactly once, from the device's
total memory; the resolved object travels to the scheduler processes as it is. The memory heuristics
are SGLang's ServerArgs helpers under SGLang's names; model_executor/pool_configurator.py calls them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import InitVar, dataclass, field
from typing import List, Optional

from sglang.srt.environ import envs
from sglang.srt.model_executor.pool_configurator import SizingPath, decide_sizing_path
from sglang.srt.server_args_cli import (
    ATTENTION_BACKENDS,
    DTYPES,
    KT_METHODS,
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    QUANTIZATIONS,
    add_cli_args,
)

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


class ServerArgsError(ValueError):
    """A flag has a bad value. The message always names the flag."""


@dataclass(frozen=True)
class AssumedDevice:
    """A device described instead of probed: plan a server for a GPU this machine does not have
    (python -m sglang.plan_memory, tests). Without one, ServerArgs asks the machine."""

    kind: str  # "cuda" or "cpu"
    memory_mib: float  # total memory (MiB, like nvidia-smi)
    vmm_problem: Optional[str] = None  # why CUDA VMM would not work; None: it works


@dataclass
class ServerArgs:
    # Model and tokenizer
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    load_format: str = "auto"
    skip_tokenizer_init: bool = False
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: Optional[str] = None
    context_length: Optional[int] = None
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None
    random_seed: int = 0

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: Optional[str] = None
    log_level: str = "info"

    # Memory and scheduling
    mem_fraction_static: Optional[float] = None
    max_total_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = None
    page_size: int = 1
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False
    stream_interval: int = 1
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False

    # Runtime
    device: Optional[str] = None
    tp_size: int = 1
    pp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    base_gpu_id: int = 0
    attention_backend: Optional[str] = None
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_bs: Optional[List[int]] = None
    disable_cuda_graph: bool = False

    # KTransformers-style hybrid CPU/GPU MoE
    kt_weight_path: Optional[str] = None
    kt_method: str = "AMXINT4"
    kt_cpuinfer: Optional[int] = None
    kt_threadpool_count: int = 1
    kt_num_gpu_experts: Optional[int] = None
    kt_max_deferred_experts_per_token: Optional[int] = None
    kt_gpu_prefill_token_threshold: Optional[int] = None

    # Not a flag: describe the device instead of probing it (see AssumedDevice).
    assume_device: InitVar[Optional[AssumedDevice]] = None

    # Resolved by __post_init__ (never flags; /server_info does not show them).
    device_memory_mib: float = field(default=0.0, init=False, repr=False)
    kv_sizing_path: SizingPath = field(default=SizingPath(False, "not resolved"), init=False, repr=False)
    user_mem_fraction_static: Optional[float] = field(default=None, init=False, repr=False)

    def __post_init__(self, assume_device: Optional[AssumedDevice]) -> None:
        self.user_mem_fraction_static = self.mem_fraction_static
        self._check_basic()
        self._resolve_device(assume_device)
        self._resolve_model_path()
        self._resolve_gpu_tier_defaults()
        self._resolve_kv_sizing_path(assume_device)
        self._resolve_mem_fraction_static()

    # ---------------------------------------------------------------- validation
    def _check_basic(self) -> None:
        def positive(name: str, value: Optional[float], allow_zero: bool = False) -> None:
            if value is None:
                return
            if value < 0 or (value == 0 and not allow_zero):
                raise ServerArgsError(
                    f"--{name.replace('_', '-')} must be {'>= 0' if allow_zero else '> 0'}, got {value}"
                )

        positive("page_size", self.page_size)
        positive("tp_size", self.tp_size)
        positive("pp_size", self.pp_size)
        positive("nnodes", self.nnodes)
        positive("max_total_tokens", self.max_total_tokens)
        positive("max_running_requests", self.max_running_requests)
        positive("max_prefill_tokens", self.max_prefill_tokens)
        positive("context_length", self.context_length)
        positive("cuda_graph_max_bs", self.cuda_graph_max_bs)
        positive("stream_interval", self.stream_interval)
        positive("kt_num_gpu_experts", self.kt_num_gpu_experts, allow_zero=True)
        positive("kt_gpu_prefill_token_threshold", self.kt_gpu_prefill_token_threshold, allow_zero=True)
        positive("kt_threadpool_count", self.kt_threadpool_count)
        positive("kt_cpuinfer", self.kt_cpuinfer)
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ServerArgsError(
                f"--max-total-tokens {self.max_total_tokens} is smaller than one page (--page-size {self.page_size})"
            )
        if self.chunked_prefill_size is not None and self.chunked_prefill_size == 0:
            raise ServerArgsError("--chunked-prefill-size must be > 0, or -1 to disable chunking")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < -1:
            raise ServerArgsError(f"--chunked-prefill-size must be > 0 or -1, got {self.chunked_prefill_size}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ServerArgsError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if not 0 < self.port < 65536:
            raise ServerArgsError(f"--port must be in 1..65535, got {self.port}")
        if self.load_format not in LOAD_FORMATS:
            raise ServerArgsError(f"--load-format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.dtype not in DTYPES:
            raise ServerArgsError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ServerArgsError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ServerArgsError(
                f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.device not in (None, "cpu", "cuda"):
            raise ServerArgsError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.attention_backend not in (None, *ATTENTION_BACKENDS):
            raise ServerArgsError(
                f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}"
            )
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ServerArgsError(f"--schedule-policy must be fcfs or lpm, got {self.schedule_policy!r}")
        if self.kt_method.upper() not in KT_METHODS:
            raise ServerArgsError(f"--kt-method must be one of {', '.join(KT_METHODS)}, got {self.kt_method!r}")
        self._check_kt_cpu_backend()
        if self.node_rank >= self.nnodes:
            raise ServerArgsError(f"--node-rank {self.node_rank} must be < --nnodes {self.nnodes}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ServerArgsError("--dist-init-addr is required when --nnodes > 1")
        if self.cuda_graph_bs is not None and any(bs <= 0 for bs in self.cuda_graph_bs):
            raise ServerArgsError(f"--cuda-graph-bs entries must be > 0, got {self.cuda_graph_bs}")

    def _check_kt_cpu_backend(self) -> None:
        """What the built-in CPU expert backend can do; anything else is refused rather than ignored."""
        import os

        cores = len(os.sched_getaffinity(0))
        if self.kt_cpuinfer is not None and self.kt_cpuinfer > cores:
            raise ServerArgsError(
                f"--kt-cpuinfer {self.kt_cpuinfer} is more than the {cores} CPUs this process may use"
            )
        if self.kt_threadpool_count != 1:
            raise ServerArgsError(
                f"--kt-threadpool-count {self.kt_threadpool_count}: the built-in CPU expert backend runs one thread "
                "pool (kt-kernel's per-NUMA-node pools are not available here); pass 1"
            )
        if self.kt_max_deferred_experts_per_token:
            raise ServerArgsError(
                f"--kt-max-deferred-experts-per-token {self.kt_max_deferred_experts_per_token}: the built-in CPU "
                "expert backend computes every expert in its own layer (deferring changes the model's outputs and "
                "needs kt-kernel); pass 0 or leave it unset"
            )

    def _check_kt_against_model(self) -> None:
        """--kt-num-gpu-experts must fit the model's experts per layer (read from its config)."""
        if self.kt_num_gpu_experts is None:
            return
        from sglang.srt.configs.model_config import load_hf_config, num_routed_experts
        from sglang.srt.model_loader.model_source import resolve_model_source

        experts = num_routed_experts(load_hf_config(resolve_model_source(self.model_path, self.load_format)))
        if not experts:
            raise ServerArgsError(f"--kt-num-gpu-experts: {self.model_path} is not a MoE model (no routed experts)")
        if self.kt_num_gpu_experts > experts:
            raise ServerArgsError(
                f"--kt-num-gpu-experts {self.kt_num_gpu_experts} must be in [0, {experts}] (experts per layer)"
            )

    def _check_quantization_against_model(self) -> None:
        """--quantization must suit the model (dense, full precision, bf16 on the GPU): refused here, at the
        command line, rather than in the scheduler process that builds the model."""
        if self.quantization is None:
            return
        from sglang.srt.configs.model_config import check_online_quantization, load_hf_config, resolve_dtype
        from sglang.srt.model_loader.model_source import resolve_model_source

        config = load_hf_config(resolve_model_source(self.model_path, self.load_format))
        try:
            check_online_quantization(
                self.quantization, config, resolve_dtype(self.dtype, config, self.device), self.device
            )
        except ValueError as e:
            raise ServerArgsError(str(e)) from e

    def _check_checkpoint_quantization(self) -> None:
        """The checkpoint's own quantization_config must be a format we run: refused here, before any weight
        is read, naming the method (config.json's own dict: a GGUF carries its formats per tensor and has none)."""
        import json
        import os

        from sglang.srt.configs.quantization_config import checkpoint_quantization

        config_path = os.path.join(self.model_path, "config.json")
        if not os.path.isfile(config_path):
            return
        with open(config_path) as f:
            config = json.load(f)
        try:
            checkpoint_quantization(config)
        except ValueError as e:
            raise ServerArgsError(f"--model-path {self.model_path}: {e}") from e

    def _resolve_device(self, assume_device: Optional[AssumedDevice]) -> None:
        if assume_device is not None:
            cuda_visible = assume_device.kind == "cuda"
        else:
            import torch

            cuda_visible = torch.cuda.is_available()
        if self.device is None:
            self.device = "cuda" if cuda_visible else "cpu"
        elif self.device == "cuda" and not cuda_visible:
            raise ServerArgsError("--device cuda was given but no CUDA GPU is visible")
        if assume_device is not None:
            self.device_memory_mib = assume_device.memory_mib
        else:
            from sglang.srt.utils.memory import get_device_memory_capacity

            self.device_memory_mib = get_device_memory_capacity(self.device, self.base_gpu_id)
        if self.device == "cpu":
            self.disable_cuda_graph = True
            if self.attention_backend == "triton":
                raise ServerArgsError("--attention-backend triton needs --device cuda")
            self.attention_backend = self.attention_backend or "torch_native"
        else:
            self.attention_backend = self.attention_backend or "triton"

    def _resolve_model_path(self) -> None:
        if self.model_path is None:
            self.model_path = DEFAULT_MODEL
        if self.load_format != "dummy":
            from sglang.srt.model_loader.model_source import resolve_model_source

            # Raises ServerArgsError naming --model-path when nothing loadable is there.
            resolve_model_source(self.model_path, self.load_format)
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        self._check_kt_against_model()
        self._check_quantization_against_model()
        self._check_checkpoint_quantization()

    # ------------------------------------------------------------ memory heuristics
    def device_memory_capacity_mib(self) -> float:
        """Total memory of the device, MiB (SGLang's get_device_memory_capacity), read once at start."""
        return self.device_memory_mib

    def _resolve_gpu_tier_defaults(self) -> None:
        """Chunked prefill size and the largest captured decode batch follow the device's memory tier."""
        gib = self.device_memory_capacity_mib() / 1024
        big_tp = self.tp_size >= 4
        if gib < 20:
            chunk, graph_bs = 2048, 8
        elif gib < 35:
            chunk, graph_bs = 4096, 160 if big_tp else 48
        elif gib < 60:
            chunk, graph_bs = 4096, 160 if big_tp else 32
        elif gib < 160:
            chunk, graph_bs = 8192, 512 if big_tp else 256
        else:
            chunk, graph_bs = 16384, 512
        if self.chunked_prefill_size is None:
            self.chunked_prefill_size = chunk
        if self.cuda_graph_max_bs is None:
            self.cuda_graph_max_bs = max(self.cuda_graph_bs) if self.cuda_graph_bs else graph_bs

    def activation_tokens(self) -> int:
        base = self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens
        return max(base, 2048)

    def reserve_for_graph_mb(self) -> float:
        """SGLang's guess for CUDA-graph memory (MiB); no DP attention in this engine, so no DP terms."""
        return self.cuda_graph_max_bs * 2

    def reserve_for_deepep_a2a_mb(self) -> float:
        """SGLang reserves 2048 MiB for DeepEP all-to-all buffers with decode graphs; this engine has
        no DeepEP backend, so the term is always 0 (kept so the formula reads like SGLang's)."""
        return 0.0

    def _parallel_reserve_mb(self) -> float:
        return self.tp_size * self.pp_size / 8 * 1024

    def _floored_above_60_gib(self, reserved_mb: float) -> float:
        return max(reserved_mb, 10 * 1024) if self.device_memory_capacity_mib() > 60 * 1024 else reserved_mb

    def pre_capture_activation_reserve_mb(self) -> float:
        """The generic activation reserve (MiB): constant metadata + a chunked-prefill's activations."""
        return self._floored_above_60_gib(512 + self.activation_tokens() * 1.5 + self._parallel_reserve_mb())

    def static_reserved_mem_mb(self) -> float:
        """Everything the classic default of mem_fraction_static keeps out of the static pool (MiB)."""
        reserved = 512 + self.activation_tokens() * 1.5 + self._parallel_reserve_mb() + self.reserve_for_graph_mb()
        return self._floored_above_60_gib(reserved) + self.reserve_for_deepep_a2a_mb()

    def post_capture_reserved_mem_mb(self) -> float:
        """With post-capture sizing, activations and graphs are measured, not guessed (MiB)."""
        return 1536 + self._parallel_reserve_mb()

    def post_capture_kv_sizing_planned(self) -> bool:
        return self.kv_sizing_path.post_capture

    def _resolve_kv_sizing_path(self, assume_device: Optional[AssumedDevice]) -> None:
        """Decided once, before the default mem_fraction_static that depends on it."""

        def vmm_problem() -> Optional[str]:
            """Asked only when post-capture sizing is requested and nothing else rules it out."""
            if assume_device is not None:
                problem = assume_device.vmm_problem
            else:
                from sglang.srt.mem_cache.vmm import vmm_supported

                ok, why = vmm_supported(self.base_gpu_id)
                problem = None if ok else why
            if problem:
                logger.warning(
                    "Post-capture KV sizing requested but CUDA VMM is unavailable (%s); using static sizing", problem
                )
            return problem

        self.kv_sizing_path = decide_sizing_path(
            flag_on=envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.get(),
            device=self.device,
            cuda_graphs=not self.disable_cuda_graph,
            chunked_prefill_size=self.chunked_prefill_size,
            attention_backend=self.attention_backend,
            vmm_problem=vmm_problem,
        )

    def _default_mem_fraction_static(self, reserved_mb: float) -> float:
        capacity = self.device_memory_capacity_mib()
        return round((capacity - reserved_mb) / capacity, 3)

    def static_path_mem_fraction_static(self) -> float:
        """The fraction the classic path uses: the user's, else the static default for this device."""
        if self.user_mem_fraction_static is not None:
            return self.user_mem_fraction_static
        return self._default_mem_fraction_static(self.static_reserved_mem_mb())

    def _resolve_mem_fraction_static(self) -> None:
        if self.mem_fraction_static is not None:
            return
        if self.post_capture_kv_sizing_planned():
            reserved = self.post_capture_reserved_mem_mb()
        else:
            reserved = self.static_reserved_mem_mb()
        self.mem_fraction_static = self._default_mem_fraction_static(reserved)
        if self.mem_fraction_static <= 0:
            raise ServerArgsError(
                f"--mem-fraction-static: the default would be {self.mem_fraction_static} on a device of "
                f"{self.device_memory_capacity_mib():.0f} MiB (reserving {reserved:.0f} MiB); give it explicitly"
            )

    # ------------------------------------------------------------------- helpers
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_public_dict(self) -> dict:
        """Server args as /server_info shows them: the flags (the API key is never echoed)."""
        out = dataclasses.asdict(self)
        for resolved in (f.name for f in dataclasses.fields(self) if not f.init):
            out.pop(resolved)
        if out.get("api_key"):
            out["api_key"] = "***"
        return out

    # ------------------------------------------------------------------- CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_cli_args(parser, {f.name: f.default for f in dataclasses.fields(ServerArgs)})

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, assume_device: Optional[AssumedDevice] = None) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: v for k, v in vars(args).items() if k in names}, assume_device=assume_device)


def prepare_server_args(argv: List[str]) -> ServerArgs:
    """Parse argv into ServerArgs; a bad value exits with argparse's usage error naming the flag."""
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    try:
        return ServerArgs.from_cli_args(args)
    except ServerArgsError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits
