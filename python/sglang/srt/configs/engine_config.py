"""The resolve step: flags + the device + the model -> one frozen EngineConfig that every process receives.

    args   = parse_server_args(argv)                 # flags only (server_args.py)
    config = resolve_engine_config(args)             # here: device facts, model facts, sizing path, defaults

Everything that depends on the machine or the model is decided here, once: the device and its memory
tier's defaults (chunked prefill size, largest captured batch), the attention backend, the model's
config (read once), the KV sizing path (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is read here and nowhere
else), mem_fraction_static, the planner's inputs, the KT settings. The records are plain data; a model
is built from the records it needs (ModelConfig, KTConfig), never from the flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from sglang.srt.configs.deepseek import UnsupportedModelError
from sglang.srt.configs.device_config import DeviceConfig, probe_device
from sglang.srt.configs.errors import ServerArgsError
from sglang.srt.configs.kt_config import MIN_STEP_CAPACITY_TOKENS, KTConfig
from sglang.srt.configs.model_config import ModelConfig, check_model_supported, load_hf_config, num_routed_experts
from sglang.srt.configs.quantization_config import (
    CheckpointQuantization,
    UnsupportedQuantization,
    checkpoint_quantization,
)
from sglang.srt.environ import envs
from sglang.srt.model_executor.pool_configurator import (
    MiB,
    PoolArgs,
    ReserveInputs,
    SizingPath,
    SWAPoolDecision,
    decide_sizing_path,
    decide_swa_pool,
    default_mem_fraction_static,
    gpu_tier_defaults,
    post_capture_reserved_mem_mb,
    pre_capture_activation_reserve_mb,
    reserve_for_graph_mb,
    static_reserved_mem_mb,
)
from sglang.srt.model_loader.model_source import resolve_model_source
from sglang.srt.server_args import DEFAULT_MODEL, ServerArgs, cli_parser, parse_server_args
from sglang.srt.server_args_cli import DEFAULT_KT_METHOD

logger = logging.getLogger(__name__)


def default_capture_batch_sizes(max_bs: int) -> List[int]:
    """SGLang's list: 1, 2, 4, 8, 12, 16..256 step 8, 272..<512 step 16, 512.. step 32, up to max_bs."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return sorted({bs for bs in sizes if bs <= max_bs} | {max_bs})


@dataclass(frozen=True)
class KernelConfig:
    """Which kernels run: the attention backend, the decode CUDA graphs, the tuned decode-GEMM tables."""

    attention_backend: str
    cuda_graphs: bool  # decode CUDA graphs are captured (CUDA only)
    cuda_graph_max_bs: int
    cuda_graph_bs: Optional[Tuple[int, ...]] = None  # --cuda-graph-bs: the sizes to capture
    decode_gemm_config_dir: str = ""  # SGLANG_DECODE_GEMM_CONFIG_DIR; "": the tables shipped with the package

    def capture_batch_sizes(self, request_rows: int) -> List[int]:
        """The decode batch sizes captured as graphs, given the request table's rows (the one rule the
        graph runner and plan_memory share)."""
        if not self.cuda_graphs:
            return []
        max_bs = min(self.cuda_graph_max_bs, request_rows)
        sizes = sorted(set(self.cuda_graph_bs)) if self.cuda_graph_bs else default_capture_batch_sizes(max_bs)
        return [bs for bs in sizes if bs <= max_bs]


@dataclass(frozen=True)
class MemoryConfig:
    """The KV sizing path and the planner's inputs from the flags (pool_configurator.py decides with them)."""

    path: SizingPath
    pool: PoolArgs
    capacity_bytes: int  # the device's total memory
    graph_reserve_bytes: int  # SGLang's guess of CUDA-graph memory (plan_memory's estimate; the server measures)
    swa_pool: SWAPoolDecision = SWAPoolDecision(None, "no sliding-window layers")

    @property
    def swa_full_tokens_ratio(self) -> Optional[float]:
        """The hybrid SWA pool's ratio, None without that pool (ModelConfig.kv_geometry takes it)."""
        return self.swa_pool.swa_full_tokens_ratio

    @property
    def post_capture(self) -> bool:
        return self.path.post_capture


@dataclass(frozen=True)
class EngineConfig:
    args: ServerArgs  # the flags with every default resolved (what /server_info shows)
    device: DeviceConfig
    model: ModelConfig
    memory: MemoryConfig
    kernels: KernelConfig
    kt: Optional[KTConfig]


def _kt_config(
    args: ServerArgs, model_path: str, device: DeviceConfig, experts: int, graph_max_bs: int
) -> Optional[KTConfig]:
    """KT is on when --kt-weight-path, --kt-num-gpu-experts or --kt-gpu-prefill-token-threshold is given; its other
    flags alone are refused by name (they would do nothing: every expert would stay on the GPU)."""
    if args.kt_cpuinfer is not None and args.kt_cpuinfer > device.usable_cpus:
        raise ServerArgsError(
            f"--kt-cpuinfer {args.kt_cpuinfer} is more than the {device.usable_cpus} CPUs this process may use"
        )
    if args.kt_weight_path is None and args.kt_num_gpu_experts is None and args.kt_gpu_prefill_token_threshold is None:
        idle = {"--kt-method": args.kt_method, "--kt-cpuinfer": args.kt_cpuinfer}
        flag = next((name for name, value in idle.items() if value is not None), None)
        if flag is not None:
            raise ServerArgsError(
                f"{flag} does nothing while KT is off: put experts on the CPU with --kt-num-gpu-experts (how many of "
                "each layer's stay on the GPU), --kt-weight-path or --kt-gpu-prefill-token-threshold"
            )
        return None
    if not experts:
        flag = next(
            f"--{name.replace('_', '-')}"
            for name in ("kt_num_gpu_experts", "kt_gpu_prefill_token_threshold", "kt_weight_path")
            if getattr(args, name) is not None
        )
        raise ServerArgsError(f"{flag}: {model_path} is not a MoE model (no routed experts)")
    if args.kt_num_gpu_experts is not None:
        if args.kt_num_gpu_experts > experts:
            raise ServerArgsError(
                f"--kt-num-gpu-experts {args.kt_num_gpu_experts} must be in [0, {experts}] (experts per layer)"
            )
    return KTConfig(
        method=(args.kt_method or DEFAULT_KT_METHOD).upper(),
        weight_path=args.kt_weight_path,
        # Each tensor-parallel rank runs its own pool: by default they share the CPUs out.
        cpu_threads=args.kt_cpuinfer or max(1, device.usable_cpus // args.tp_size),
        num_gpu_experts=args.kt_num_gpu_experts or 0,
        gpu_prefill_token_threshold=args.kt_gpu_prefill_token_threshold,
        step_capacity_tokens=max(MIN_STEP_CAPACITY_TOKENS, graph_max_bs),
    )


def _declared_quantization(path: str, flag: str) -> Optional[CheckpointQuantization]:
    """The format a checkpoint directory's config.json declares (None where it has none or no readable config)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    try:
        return checkpoint_quantization(raw if isinstance(raw, dict) else {})
    except UnsupportedQuantization as e:
        raise ServerArgsError(f"{flag} {path}: {e}") from e


# --kt-method names whose format is INT4 (KTransformers' AMXINT4, and RAWINT4: the checkpoint's own int4 experts).
INT4_KT_METHODS = ("INT4", "AMXINT4", "RAWINT4")


def _kt_method_for_checkpoint(
    method: str, checkpoint: Optional[CheckpointQuantization], model_path: str, weight_path: Optional[str]
) -> str:
    """--kt-method resolved against the checkpoint the experts come from.

    A pack-quantized INT4 checkpoint (Kimi-K2-Thinking, K2.5): an INT4 method holds its experts as they are, in the
    checkpoint's groups (INT4_G<size>); RAWINT4 needs such a checkpoint. An fp8 method (FP8: 128x128 blocks,
    FP8_PERCHANNEL: rows) promises a native FP8 checkpoint's own experts: on one of the other scale layout it would
    re-quantize them, so that is refused naming the method that holds them. Other methods are formats of their own
    (the experts dequantized, then quantized into them). Refusals name the flag."""
    from sglang.srt.layers.quantization import checkpoint_fp8_holder, get_moe_method, int4_method_name

    if weight_path is not None:
        source = _declared_quantization(weight_path, "--kt-weight-path")
        if source is not None and source.is_int4:
            raise ServerArgsError(
                f"--kt-weight-path {weight_path}: a pack-quantized int4 checkpoint's experts load from --model-path "
                "(give it there; its other layers are dequantized at load)"
            )
        if method == "RAWINT4":
            raise ServerArgsError("--kt-method RAWINT4 runs --model-path's own int4 experts, not --kt-weight-path's")
        return method
    if checkpoint is not None and checkpoint.is_int4 and method in INT4_KT_METHODS:
        return int4_method_name(checkpoint.group_size)
    if method == "RAWINT4":
        raise ServerArgsError(
            f"--kt-method RAWINT4 runs a checkpoint's own int4 experts (compressed-tensors pack-quantized, as "
            f"Kimi-K2-Thinking ships them); {model_path} has none: --kt-method INT4 (or AMXINT4) quantizes its "
            "experts to INT4"
        )
    chosen = get_moe_method(method)
    fp8_strategies = ("block", "channel", "tensor")
    if checkpoint is None or checkpoint.is_int4 or not any(chosen.holds_checkpoint_fp8(s) for s in fp8_strategies):
        return method
    if chosen.holds_checkpoint_fp8(checkpoint.strategy):
        return method
    holder = checkpoint_fp8_holder(checkpoint.strategy)
    raise ServerArgsError(
        f"--kt-method {method}: {model_path} is a native FP8 checkpoint with per-{checkpoint.strategy} scales "
        f"({checkpoint.scale_name}), which --kt-method {holder} runs as they are; {method} would re-quantize its "
        "experts"
    )


def _model_config(args: ServerArgs, model_path: str, device: str) -> ModelConfig:
    """The model's facts, its config read once (a missing or unloadable model names --model-path; a config we
    cannot run exactly, e.g. another DeepSeek topk_method, names the field)."""
    source = resolve_model_source(model_path, args.load_format)
    try:
        hf_config = load_hf_config(source)  # a GGUF's metadata we would not honour is a ValueError naming its key
        check_model_supported(hf_config)
    except (UnsupportedModelError, ValueError) as e:
        raise ServerArgsError(f"--model-path {model_path}: {e}") from e
    try:
        return ModelConfig.from_hf_config(
            hf_config,
            source=source,
            dtype=args.dtype,
            kv_cache_dtype=args.kv_cache_dtype,
            device=device,
            context_length=args.context_length,
            quantization=args.quantization,
            tp_size=args.tp_size,
        )
    except ValueError as e:  # the message names the flag (--quantization, --context-length, --tp-size)
        raise ServerArgsError(str(e)) from e


def resolve_engine_config(
    args: ServerArgs, device: Optional[DeviceConfig] = None, post_capture: Optional[bool] = None
) -> EngineConfig:
    """Resolve the flags against the device (probed unless described) and the model.

    `post_capture`: plan that sizing path (plan_memory plans both); None: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.
    Raises ServerArgsError naming the flag when the flags cannot be served."""
    if device is None:
        device = probe_device(args.device, args.base_gpu_id)
    elif args.device == "cuda" and device.kind != "cuda":
        raise ServerArgsError("--device cuda was given but no CUDA GPU is visible")
    kind = device.kind
    if kind == "cpu" and args.attention_backend == "triton":
        raise ServerArgsError("--attention-backend triton needs --device cuda")
    attention_backend = args.attention_backend or ("torch_native" if kind == "cpu" else "triton")
    cuda_graphs = kind == "cuda" and not args.disable_cuda_graph
    model_path = args.model_path or DEFAULT_MODEL
    model = _model_config(args, model_path, kind)

    tier = gpu_tier_defaults(device.memory_mib, args.tp_size)
    chunk = args.chunked_prefill_size if args.chunked_prefill_size is not None else tier.chunked_prefill_size
    graph_max_bs = args.cuda_graph_max_bs
    if graph_max_bs is None:
        graph_max_bs = max(args.cuda_graph_bs) if args.cuda_graph_bs else tier.cuda_graph_max_bs

    def vmm_problem() -> Optional[str]:
        """Asked only when post-capture sizing is requested and nothing else rules it out."""
        problem = device.vmm_problem(args.base_gpu_id)
        if problem:
            logger.warning(
                "Post-capture KV sizing requested but CUDA VMM is unavailable (%s); using static sizing", problem
            )
        return problem

    path = decide_sizing_path(
        flag_on=envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.get() if post_capture is None else post_capture,
        device=kind,
        cuda_graphs=cuda_graphs,
        chunked_prefill_size=chunk,
        attention_backend=attention_backend,
        vmm_problem=vmm_problem,
    )
    reserve = ReserveInputs(
        capacity_mib=device.memory_mib,
        chunked_prefill_size=chunk,
        max_prefill_tokens=args.max_prefill_tokens,
        tp_size=args.tp_size,
        pp_size=args.pp_size,
        cuda_graph_max_bs=graph_max_bs,
    )
    static_fraction = args.mem_fraction_static
    if static_fraction is None:
        static_fraction = default_mem_fraction_static(device.memory_mib, static_reserved_mem_mb(reserve))
    mem_fraction = args.mem_fraction_static
    if mem_fraction is None:
        reserved = post_capture_reserved_mem_mb(reserve) if path.post_capture else static_reserved_mem_mb(reserve)
        mem_fraction = default_mem_fraction_static(device.memory_mib, reserved)
        if mem_fraction <= 0:
            raise ServerArgsError(
                f"--mem-fraction-static: the default would be {mem_fraction} on a device of "
                f"{device.memory_mib:.0f} MiB (reserving {reserved:.0f} MiB); give it explicitly"
            )
    kt = _kt_config(args, model_path, device, num_routed_experts(model.hf_config), graph_max_bs)
    kt_flag = kt.method if kt is not None else None  # the flag as given, its default applied (/server_info)
    if kt is not None:  # the experts' format: an INT4 method on an int4 checkpoint takes its groups (INT4_G<size>)
        method = _kt_method_for_checkpoint(kt.method, model.checkpoint_quantization, model_path, kt.weight_path)
        kt = dataclasses.replace(kt, method=method)
    resolved = dataclasses.replace(
        args,
        kt_method=kt_flag,
        model_path=model_path,
        tokenizer_path=args.tokenizer_path or model_path,
        served_model_name=args.served_model_name or model_path,
        device=kind,
        attention_backend=attention_backend,
        disable_cuda_graph=not cuda_graphs,
        chunked_prefill_size=chunk,
        cuda_graph_max_bs=graph_max_bs,
        mem_fraction_static=mem_fraction,
    )
    pool = PoolArgs(
        mem_fraction_static=mem_fraction,
        static_mem_fraction_static=static_fraction,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        context_len=model.context_len,
        activation_reserve_bytes=int(pre_capture_activation_reserve_mb(reserve) * MiB),
        # Lending a reservation from the pool's tail needs one tail size on every rank (KV heads split evenly).
        lend_reservations=model.num_key_value_heads % args.tp_size == 0,
    )
    return EngineConfig(
        args=resolved,
        device=device,
        model=model,
        memory=MemoryConfig(
            path=path,
            pool=pool,
            capacity_bytes=device.memory_bytes,
            graph_reserve_bytes=int(reserve_for_graph_mb(reserve) * MiB),
            swa_pool=decide_swa_pool(
                window_layers=model.num_window_layers,
                swa_full_tokens_ratio=args.swa_full_tokens_ratio,
                disabled=args.disable_hybrid_swa_memory,
            ),
        ),
        kernels=KernelConfig(
            attention_backend=attention_backend,
            cuda_graphs=cuda_graphs,
            cuda_graph_max_bs=graph_max_bs,
            cuda_graph_bs=args.cuda_graph_bs,
            decode_gemm_config_dir=envs.SGLANG_DECODE_GEMM_CONFIG_DIR.get(),
        ),
        kt=kt,
    )


def resolve_or_exit(args: ServerArgs, parser: argparse.ArgumentParser) -> EngineConfig:
    """The CLI's resolve: a value this machine or model cannot serve exits with argparse's usage error (code 2)
    naming the flag, before any process starts or any weight is read."""
    try:
        return resolve_engine_config(args)
    except ServerArgsError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def prepare_engine_config(argv: List[str]) -> EngineConfig:
    """`python -m sglang.launch_server`'s configuration: parse, validate, resolve (exit 2 on a bad flag)."""
    parser = cli_parser()
    return resolve_or_exit(parse_server_args(argv, parser), parser)
