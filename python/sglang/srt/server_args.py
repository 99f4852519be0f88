"""ServerArgs: every flag of `python -m sglang.launch_server`, SGLang's names and defaults.

Defaults that depend on the machine (device, chunked prefill size, CUDA-graph batch sizes,
mem_fraction_static) are resolved in `__post_init__`, exactly once, from the device's total memory.
The memory heuristics are split into small named helpers so the static and post-capture paths can
be compared term by term.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float", "bf16", "fp16", "fp32")
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
ATTENTION_BACKENDS = ("torch_native", "triton")
KT_METHODS = ("BF16", "FP8", "INT8", "INT4", "MXFP4", "AMXINT4", "AMXINT8")


def _cuda_bindings_installed() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:
        return False


class ServerArgsError(ValueError):
    """A flag has a bad value. The message always names the flag."""


@dataclass
class ServerArgs:
    # Model and tokenizer
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    load_format: str = "auto"
    skip_tokenizer_init: bool = False
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
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
    kt_threadpool_count: int = 2
    kt_num_gpu_experts: Optional[int] = None
    kt_max_deferred_experts_per_token: Optional[int] = None
    kt_gpu_prefill_token_threshold: Optional[int] = None

    # Filled in by __post_init__ (never flags): why a default was chosen, for the memory plan log.
    resolved_notes: List[str] = field(default_factory=list, repr=False)
    user_mem_fraction_static: Optional[float] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.user_mem_fraction_static = self.mem_fraction_static
        self._check_basic()
        self._resolve_device()
        self._resolve_model_path()
        self._resolve_gpu_tier_defaults()
        self._resolve_mem_fraction_static()

    # ---------------------------------------------------------------- validation
    def _check_basic(self) -> None:
        def positive(name: str, value: Optional[float], allow_zero: bool = False) -> None:
            if value is None:
                return
            if value < 0 or (value == 0 and not allow_zero):
                raise ServerArgsError(f"--{name.replace('_', '-')} must be {'>= 0' if allow_zero else '> 0'}, got {value}")

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
            raise ServerArgsError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.device not in (None, "cpu", "cuda"):
            raise ServerArgsError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.attention_backend not in (None, *ATTENTION_BACKENDS):
            raise ServerArgsError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ServerArgsError(f"--schedule-policy must be fcfs or lpm, got {self.schedule_policy!r}")
        if self.kt_method.upper() not in KT_METHODS:
            raise ServerArgsError(f"--kt-method must be one of {', '.join(KT_METHODS)}, got {self.kt_method!r}")
        if self.node_rank >= self.nnodes:
            raise ServerArgsError(f"--node-rank {self.node_rank} must be < --nnodes {self.nnodes}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ServerArgsError("--dist-init-addr is required when --nnodes > 1")
        if self.cuda_graph_bs is not None and any(bs <= 0 for bs in self.cuda_graph_bs):
            raise ServerArgsError(f"--cuda-graph-bs entries must be > 0, got {self.cuda_graph_bs}")

    def _resolve_device(self) -> None:
        import torch

        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        elif self.device == "cuda" and not torch.cuda.is_available():
            raise ServerArgsError("--device cuda was given but no CUDA GPU is visible")
        if self.device == "cpu":
            if not self.disable_cuda_graph:
                self.resolved_notes.append("CUDA graphs off: --device cpu")
            self.disable_cuda_graph = True
            if self.attention_backend == "triton":
                raise ServerArgsError("--attention-backend triton needs --device cuda")
            self.attention_backend = self.attention_backend or "torch_native"
        else:
            self.attention_backend = self.attention_backend or "triton"

    def _resolve_model_path(self) -> None:
        if self.model_path is None:
            self.model_path = DEFAULT_MODEL
            self.resolved_notes.append(f"--model-path not given: serving the built-in {DEFAULT_MODEL}")
        if self.load_format != "dummy":
            from sglang.srt.model_loader.model_source import resolve_model_source

            # Raises ServerArgsError naming --model-path when nothing loadable is there.
            resolve_model_source(self.model_path, self.load_format)
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path

    # ------------------------------------------------------------ memory heuristics
    def device_memory_capacity_mib(self) -> float:
        from sglang.srt.utils.memory import get_device_memory_capacity

        return get_device_memory_capacity(self.device, self.base_gpu_id)

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

    def pre_capture_activation_reserve_mb(self) -> float:
        """The generic activation reserve (MiB): constant metadata + a chunked-prefill's activations."""
        reserved = 512 + self.activation_tokens() * 1.5 + self._parallel_reserve_mb()
        if self.device_memory_capacity_mib() > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return reserved

    def static_reserved_mem_mb(self) -> float:
        """Everything the classic default of mem_fraction_static keeps out of the static pool (MiB)."""
        reserved = 512 + self.activation_tokens() * 1.5 + self._parallel_reserve_mb() + self.reserve_for_graph_mb()
        if self.device_memory_capacity_mib() > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return reserved + self.reserve_for_deepep_a2a_mb()

    def post_capture_reserved_mem_mb(self) -> float:
        """With post-capture sizing, activations and graphs are measured, not guessed (MiB)."""
        return 1536 + self._parallel_reserve_mb()

    def post_capture_kv_sizing_planned(self) -> bool:
        return not self.post_capture_kv_sizing_blockers()

    def post_capture_kv_sizing_blockers(self) -> List[str]:
        """Why post-capture sizing is not planned (empty list = planned)."""
        reasons = []
        if not envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.get():
            reasons.append("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off")
        if self.device != "cuda":
            reasons.append("device is not CUDA")
        if self.disable_cuda_graph:
            reasons.append("decode CUDA graphs are disabled")
        if self.chunked_prefill_size is None or self.chunked_prefill_size <= 0:
            reasons.append("chunked prefill is disabled")
        if self.device == "cuda" and self.attention_backend != "triton":
            reasons.append(f"the {self.attention_backend} attention backend has no CUDA graphs")
        if self.device == "cuda" and not _cuda_bindings_installed():
            reasons.append("cuda-bindings is not installed (pip install cuda-bindings)")
        # Every model this engine serves uses MHA-style KV and nothing else claims the KV memory
        # (no MLA, no hybrid SWA/mamba pools, no disaggregation); ModelRunner re-checks the model.
        return reasons

    def static_path_mem_fraction_static(self) -> float:
        """The fraction the classic path uses: the user's, else the static default for this device."""
        if self.user_mem_fraction_static is not None:
            return self.user_mem_fraction_static
        capacity = self.device_memory_capacity_mib()
        return round((capacity - self.static_reserved_mem_mb()) / capacity, 3)

    def _resolve_mem_fraction_static(self) -> None:
        if self.mem_fraction_static is not None:
            return
        capacity = self.device_memory_capacity_mib()
        if self.post_capture_kv_sizing_planned():
            reserved = self.post_capture_reserved_mem_mb()
            why = "post-capture"
        else:
            reserved = self.static_reserved_mem_mb()
            why = "static"
        self.mem_fraction_static = round((capacity - reserved) / capacity, 3)
        if self.mem_fraction_static <= 0:
            raise ServerArgsError(
                f"--mem-fraction-static: the default would be {self.mem_fraction_static} on a device of "
                f"{capacity:.0f} MiB (reserving {reserved:.0f} MiB); give it explicitly"
            )
        self.resolved_notes.append(
            f"mem_fraction_static={self.mem_fraction_static} ({why}: ({capacity:.0f} - {reserved:.0f}) / {capacity:.0f} MiB)"
        )

    # ------------------------------------------------------------------- helpers
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_public_dict(self) -> dict:
        """Server args as /server_info shows them (the API key is never echoed)."""
        out = dataclasses.asdict(self)
        out.pop("resolved_notes", None)
        out.pop("user_mem_fraction_static", None)
        if out.get("api_key"):
            out["api_key"] = "***"
        return out

    # ------------------------------------------------------------------- CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        from sglang.srt.server_args_cli import add_cli_args

        add_cli_args(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "resolved_notes"}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


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
