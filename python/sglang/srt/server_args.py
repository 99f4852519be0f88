"""ServerArgs: every flag of `python -m sglang.launch_server`, SGLang's names and defaults.

Parsing and validation only: building a ServerArgs touches neither the device, the disk nor a driver.
Whatever depends on the machine or the model (the device, the defaults of the memory tier, the KV
sizing path, mem_fraction_static, the model's own facts) is resolved once, by
configs/engine_config.resolve_engine_config, into the frozen EngineConfig every process receives.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import List, Optional, Tuple

from sglang.srt.configs.errors import ServerArgsError
from sglang.srt.server_args_cli import (
    ATTENTION_BACKENDS,
    DTYPES,
    GRAMMAR_BACKENDS,
    KT_METHODS,
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    QUANTIZATIONS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    add_cli_args,
)

__all__ = ["DEFAULT_MODEL", "ServerArgs", "ServerArgsError", "parse_server_args"]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ServerArgs:
    """The flags as given (None: resolved later from the device or the model)."""

    # Model and tokenizer
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    load_format: str = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False  # tokenizers only: models never run checkpoint code (see --trust-remote-code)
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: Optional[str] = None
    context_length: Optional[int] = None
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None
    random_seed: int = 0
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None
    grammar_backend: str = "xgrammar"

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: Optional[str] = None
    log_level: str = "info"
    log_requests: bool = False  # a log line per request received and finished (ids, sizes, parameters; no text)
    skip_server_warmup: bool = False

    # Memory and scheduling
    mem_fraction_static: Optional[float] = None
    max_total_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = None
    page_size: int = 1
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False
    # The hybrid SWA pool (upstream's flags): sliding-window layers keep their K/V in a pool of this many tokens per
    # token of the full-attention layers' pool, out-of-window tokens freed from it; off: every layer keeps every token.
    swa_full_tokens_ratio: float = 0.8
    disable_hybrid_swa_memory: bool = False
    stream_interval: int = 1
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False

    # Runtime
    device: Optional[str] = None
    tp_size: int = 1
    dp_size: int = 1  # accepted at 1: data parallelism is several servers behind sglang-router here
    pp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    base_gpu_id: int = 0
    attention_backend: Optional[str] = None
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_bs: Optional[Tuple[int, ...]] = None
    disable_cuda_graph: bool = False

    # KTransformers-style hybrid CPU/GPU MoE
    kt_weight_path: Optional[str] = None
    kt_method: Optional[str] = None  # KT's expert format; None: DEFAULT_KT_METHOD once KT is on
    kt_cpuinfer: Optional[int] = None
    kt_threadpool_count: int = 1
    kt_num_gpu_experts: Optional[int] = None
    kt_max_deferred_experts_per_token: Optional[int] = None
    kt_gpu_prefill_token_threshold: Optional[int] = None

    def __post_init__(self) -> None:
        if self.cuda_graph_bs is not None and not isinstance(self.cuda_graph_bs, tuple):
            object.__setattr__(self, "cuda_graph_bs", tuple(self.cuda_graph_bs))  # hashable, as a frozen field
        self._check_basic()

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
        if self.dp_size != 1:
            raise ServerArgsError(
                f"--dp-size {self.dp_size}: data parallelism is not built in; run {self.dp_size} servers behind "
                "sglang-router (README: several replicas) and pass 1"
            )
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
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise ServerArgsError(f"--swa-full-tokens-ratio must be in (0, 1], got {self.swa_full_tokens_ratio}")
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
        if self.device == "cpu" and self.attention_backend == "triton":
            raise ServerArgsError("--attention-backend triton needs --device cuda")
        if self.attention_backend not in (None, *ATTENTION_BACKENDS):
            raise ServerArgsError(
                f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}"
            )
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ServerArgsError(
                f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}"
            )
        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise ServerArgsError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}"
            )
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ServerArgsError(
                f"--grammar-backend must be one of {', '.join(GRAMMAR_BACKENDS)}, got {self.grammar_backend!r}"
            )
        if self.grammar_backend == "llguidance" and importlib.util.find_spec("llguidance") is None:
            raise ServerArgsError(
                "--grammar-backend llguidance needs the llguidance package (pip install llguidance); "
                "or use xgrammar or none"
            )
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ServerArgsError(f"--schedule-policy must be fcfs or lpm, got {self.schedule_policy!r}")
        if self.kt_method is not None and self.kt_method.upper() not in KT_METHODS:
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

    # ------------------------------------------------------------------- helpers
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_public_dict(self) -> dict:
        """Server args as /server_info shows them: the flags, resolved (the API key is never echoed)."""
        out = dataclasses.asdict(self)
        if out.get("cuda_graph_bs") is not None:
            out["cuda_graph_bs"] = list(out["cuda_graph_bs"])
        if out.get("api_key"):
            out["api_key"] = "***"
        return out

    # ------------------------------------------------------------------- CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_cli_args(parser, {f.name: f.default for f in dataclasses.fields(ServerArgs)})

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


def parse_server_args(argv: List[str], parser: Optional[argparse.ArgumentParser] = None) -> ServerArgs:
    """Parse and validate argv; a bad value exits with argparse's usage error (code 2) naming the flag.
    Resolving against the machine and the model is engine_config.prepare_engine_config's job."""
    parser = parser or cli_parser()
    try:
        return ServerArgs.from_cli_args(parser.parse_args(argv))
    except ServerArgsError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def cli_parser(prog: str = "python -m sglang.launch_server") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    ServerArgs.add_cli_args(parser)
    return parser
