"""The weight format a checkpoint declares in config.json's ``quantization_config``, read at start-up.

A checkpoint we can run exactly parses into a frozen ``CheckpointQuantization``; anything else (AWQ, GPTQ,
bitsandbytes, a compressed-tensors scheme we do not run, a method nobody knows) is a ValueError naming the
method and listing what is supported, raised before any weight file is opened. Loading an unknown format
as if it were full precision would answer wrongly without a word; refusing is the only honest choice.

Supported (the native FP8 layouts of DeepSeek-V3/R1, Qwen3-*-FP8, GLM-4.5-FP8, MiniMax-M2, GLM-4.7-FP8; the native
INT4 experts of Kimi-K2-Thinking / K2.5):
  * ``quant_method: fp8`` with ``weight_block_size: [128, 128]``: each quantized linear's ``weight`` is e4m3
    with ``weight_scale_inv`` fp32 [ceil(out/128), ceil(in/128)], weight = q x scale_inv per block;
  * ``quant_method: compressed-tensors``, ``format: float-quantized``, 8-bit float weights with one
    ``weight_scale`` per output channel or per tensor (or per 128x128 block), weight = q x scale;
  * ``quant_method: compressed-tensors``, ``format: pack-quantized``, 4-bit symmetric int weights with one
    ``weight_scale`` per ``group_size`` inputs: ``weight_packed`` int32 [out, ceil(in/8)] (eight codes q + 8 a
    word, the first in the low bits), ``weight_shape`` [out, in], weight = q x scale per group. Routed experts
    are held as they are by an INT4 expert format of that group (KT: --kt-method RAWINT4, INT4 or AMXINT4); every
    other such layer is dequantized at load.
Modules the config leaves unquantized (``modules_to_not_convert``, ``ignored_layers``, ``ignore``) are kept.
A compressed-tensors ``kv_cache_scheme`` of per-tensor fp8 scales is accepted: the ``k_scale`` / ``v_scale``
tensors beside the weights serve an fp8 KV cache (model_loader/kv_scales.py); per-head or dynamic KV schemes
are refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

BLOCK = 128

SUPPORTED = (
    "fp8 (weight_block_size [128, 128], weight_scale_inv per block)",
    "compressed-tensors (format float-quantized: 8-bit float weights, weight_scale per channel, per tensor "
    "or per 128x128 block)",
    "compressed-tensors (format pack-quantized: 4-bit symmetric int weights, weight_scale per group, no activation "
    "quantization)",
)


class UnsupportedQuantization(ValueError):
    """The checkpoint's quantization_config names a format this engine does not run."""


def _refuse(what: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(
        f"quantization_config: {what}; this engine runs checkpoints in full precision (bf16/fp16/fp32) or "
        f"in one of: {'; '.join(SUPPORTED)}"
    )


@dataclass(frozen=True)
class CheckpointQuantization:
    """How a checkpoint's quantized linear layers are stored."""

    method: str  # "fp8" or "compressed-tensors"
    # 8-bit float: "block" (128x128 scales), "channel" (one per output row) or "tensor" (one scalar);
    # 4-bit int: "group" (one per group_size inputs of a row)
    strategy: str
    scale_name: str  # the scale tensor's suffix beside each `weight`: "weight_scale_inv" or "weight_scale"
    activation_scheme: str  # "dynamic" (quantized per call), "static" (the checkpoint's input_scale), "none" (W4A16)
    ignored: Tuple[str, ...] = ()  # module names (or "re:" patterns) kept in full precision
    group_size: Optional[int] = None  # "group": inputs per scale

    @property
    def is_int4(self) -> bool:
        return self.strategy == "group"

    @property
    def param_scale_name(self) -> str:
        """The scale's name on our layers: weight_scale_inv for blocks (layers/linear.py), else weight_scale."""
        return "weight_scale_inv" if self.strategy == "block" else "weight_scale"

    @property
    def block_size(self) -> Optional[int]:
        return BLOCK if self.strategy == "block" else None

    def is_ignored(self, module: str) -> bool:
        """True when the module named `module` (e.g. "model.layers.0.mlp.gate") stays in full precision."""
        for entry in self.ignored:
            if entry.startswith("re:"):
                if re.fullmatch(entry[3:], module):
                    return True
            elif module == entry or module.endswith("." + entry) or module.startswith(entry + "."):
                return True
        return False


def _block_size(value: Any) -> Optional[Tuple[int, ...]]:
    return None if value is None else tuple(int(v) for v in value)


def _parse_fp8(cfg: Mapping[str, Any]) -> CheckpointQuantization:
    fmt = cfg.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _refuse(f"fp8 with fmt {fmt!r} is not supported (only e4m3)")
    block = _block_size(cfg.get("weight_block_size"))
    if block != (BLOCK, BLOCK):
        raise _refuse(
            f"fp8 with weight_block_size {list(block) if block else None} is not supported (only [128, 128]; "
            "per-tensor fp8 checkpoints are not)"
        )
    scheme = cfg.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise _refuse(f"fp8 block-quantized with activation_scheme {scheme!r} is not supported (only dynamic)")
    ignored = tuple(cfg.get("modules_to_not_convert") or ()) + tuple(cfg.get("ignored_layers") or ())
    return CheckpointQuantization("fp8", "block", "weight_scale_inv", "dynamic", ignored)


def _check_kv_cache_scheme(scheme: Any) -> None:
    """compressed-tensors' ``kv_cache_scheme``: one fp8 scale per layer for K and one for V (``k_scale`` /
    ``v_scale`` beside the weights, model_loader/kv_scales.py), used by an fp8 KV cache. Per-head or dynamic
    KV quantization is refused by name."""
    if not scheme:
        return
    kind = (scheme.get("type"), scheme.get("num_bits"))
    if kind != ("float", 8):
        raise _refuse(f"compressed-tensors kv_cache_scheme of type {kind[0]!r} with {kind[1]} bits is not supported")
    if scheme.get("strategy", "tensor") != "tensor":
        raise _refuse(
            f"compressed-tensors kv_cache_scheme strategy {scheme.get('strategy')!r} is not supported (only "
            "'tensor': one k_scale and one v_scale per layer)"
        )
    if scheme.get("dynamic") or scheme.get("symmetric") is False:
        raise _refuse("compressed-tensors kv_cache_scheme with dynamic or asymmetric scales is not supported")


def _parse_compressed_tensors(cfg: Mapping[str, Any]) -> CheckpointQuantization:
    fmt = cfg.get("format")
    if fmt not in ("float-quantized", "pack-quantized"):
        raise _refuse(
            f"compressed-tensors with format {fmt!r} is not supported (only float-quantized and pack-quantized)"
        )
    _check_kv_cache_scheme(cfg.get("kv_cache_scheme"))
    sparsity = cfg.get("sparsity_config") or {}
    if sparsity and sparsity.get("format", "dense") != "dense":
        raise _refuse(f"compressed-tensors sparsity_config format {sparsity.get('format')!r} is not supported")
    if cfg.get("transform_config"):  # rotated weights (Hadamard / SpinQuant): as stored they would answer wrongly
        raise _refuse("compressed-tensors transform_config (rotated weights) is not supported")
    groups = dict(cfg.get("config_groups") or {})
    if len(groups) != 1:
        raise _refuse(f"compressed-tensors with {len(groups)} config_groups is not supported (exactly one)")
    (group,) = groups.values()
    if group.get("format", fmt) != fmt:
        raise _refuse(f"compressed-tensors group format {group.get('format')!r} is not supported")
    targets = tuple(group.get("targets") or ("Linear",))
    if targets != ("Linear",):
        raise _refuse(f"compressed-tensors targets {list(targets)} are not supported (only ['Linear'])")
    if fmt == "pack-quantized":
        return _parse_pack_quantized(group, tuple(cfg.get("ignore") or ()))
    weights = group.get("weights") or {}
    if (weights.get("type"), weights.get("num_bits")) != ("float", 8):
        raise _refuse(
            f"compressed-tensors weights of type {weights.get('type')!r} with {weights.get('num_bits')} bits "
            "are not supported (only 8-bit float)"
        )
    if weights.get("dynamic") or weights.get("symmetric") is False:
        raise _refuse("compressed-tensors dynamic or asymmetric weight quantization is not supported")
    strategy = weights.get("strategy")
    if strategy == "block":
        block = _block_size(weights.get("block_structure"))
        if block != (BLOCK, BLOCK):
            raise _refuse(f"compressed-tensors block_structure {block} is not supported (only [128, 128])")
    elif strategy not in ("channel", "tensor"):
        raise _refuse(f"compressed-tensors weight strategy {strategy!r} is not supported (channel, tensor, block)")
    acts = group.get("input_activations") or {}
    if acts and (acts.get("type"), acts.get("num_bits")) != ("float", 8):
        raise _refuse("compressed-tensors input activations other than 8-bit float are not supported")
    scheme = "static" if acts and not acts.get("dynamic", False) else "dynamic"
    return CheckpointQuantization(
        "compressed-tensors", strategy, "weight_scale", scheme, tuple(cfg.get("ignore") or ())
    )


def _parse_pack_quantized(group: Mapping[str, Any], ignored: Tuple[str, ...]) -> CheckpointQuantization:
    """compressed-tensors pack-quantized: 4-bit symmetric int weights with a scale per group of inputs, weight-only
    (W4A16: Kimi-K2-Thinking's and K2.5's routed experts)."""
    weights = group.get("weights") or {}
    kind = (weights.get("type"), weights.get("num_bits"))
    if kind != ("int", 4):
        raise _refuse(
            f"compressed-tensors pack-quantized weights of type {kind[0]!r} with {kind[1]} bits are not supported "
            "(only 4-bit int)"
        )
    if weights.get("strategy") != "group":
        raise _refuse(
            f"compressed-tensors pack-quantized weight strategy {weights.get('strategy')!r} is not supported (only "
            "group)"
        )
    if weights.get("dynamic") or weights.get("symmetric") is False:
        raise _refuse("compressed-tensors dynamic or asymmetric (zero-point) weight quantization is not supported")
    if weights.get("actorder"):
        raise _refuse(f"compressed-tensors actorder {weights.get('actorder')!r} (g_idx) is not supported")
    size = weights.get("group_size")
    if not isinstance(size, int) or size <= 0 or size % 2:
        raise _refuse(f"compressed-tensors pack-quantized group_size {size!r} is not supported (a positive even size)")
    if group.get("input_activations"):
        raise _refuse("compressed-tensors pack-quantized with input_activations is not supported (weight-only)")
    return CheckpointQuantization("compressed-tensors", "group", "weight_scale", "none", ignored, size)


def parse_checkpoint_quantization(quantization_config: Optional[Mapping[str, Any]]) -> Optional[CheckpointQuantization]:
    """None for a full-precision checkpoint (no quantization_config); the format for one we run; otherwise
    UnsupportedQuantization naming the method. Reads only config.json's dict, never a weight."""
    if not quantization_config:
        return None
    cfg = dict(quantization_config)
    method = str(cfg.get("quant_method") or "").lower()
    if method == "fp8":
        return _parse_fp8(cfg)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(cfg)
    if not method:
        raise _refuse("no quant_method given")
    raise _refuse(f"quant_method {cfg.get('quant_method')!r} is not supported")


def checkpoint_quantization(config: Any) -> Optional[CheckpointQuantization]:
    """The checkpoint format declared by `config` (a transformers PretrainedConfig, or config.json's dict as
    read from disk), looking into its text_config for multimodal wrappers; None for full precision;
    UnsupportedQuantization where we cannot run it exactly."""

    def field(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    text = field(config, "text_config") or {}
    return parse_checkpoint_quantization(field(config, "quantization_config") or field(text, "quantization_config"))


# The architectures whose model code builds its linear layers (and experts) in a native FP8 checkpoint's format;
# the others' checkpoints are dequantized at load on every device.
CHECKPOINT_FP8_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeForCausalLM",
    "Qwen2MoeForCausalLM",
    "OlmoeForCausalLM",
    "Phi3ForCausalLM",
    "MixtralForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)


def gpu_splits_scale_groups(size: int) -> bool:
    """Whether the GPU's fused MoE can split its K steps by two-codes-a-byte scale groups of `size` inputs (a power of
    two of at least 16: 32, 64 and 128 are what checkpoints ship); the CPU runs any even size."""
    return size >= 16 and not size & (size - 1)


def check_int4_groups_on_device(quant: Optional[CheckpointQuantization], device: str) -> None:
    """A pack-quantized checkpoint whose groups the GPU's fused MoE cannot split its K steps by, refused on CUDA."""
    if quant is None or not quant.is_int4 or device != "cuda":
        return
    size = quant.group_size
    assert size is not None
    if not gpu_splits_scale_groups(size):
        raise _refuse(f"compressed-tensors pack-quantized group_size {size} on the GPU (a power of two >= 16 there)")


def linear_weight_format(
    quant: Optional[CheckpointQuantization], device: str, dtype: Any, architecture: str
) -> Optional[str]:
    """The linear layers' weight format for this checkpoint (layers/linear.py): on the GPU they keep the
    checkpoint's fp8 ("fp8_block", or "fp8_channel" for per-channel/per-tensor scales; a MoE model's block-fp8
    experts too, per-channel experts are dequantized); the CPU dequantizes at load (None)."""
    if quant is None or quant.is_int4 or device != "cuda" or architecture not in CHECKPOINT_FP8_ARCHITECTURES:
        return None  # int4 checkpoints: every linear layer dequantized at load (the experts' format decides theirs)
    if quant.strategy == "block":
        return "fp8_block"
    if str(dtype) != "torch.bfloat16":  # torch._scaled_mm's row-wise scales produce bf16 only
        raise ValueError(f"a {quant.method} per-{quant.strategy} fp8 checkpoint on the GPU needs --dtype bfloat16")
    return "fp8_channel"


def block_aligned_format(quantization: Optional[str], width: int) -> Optional[str]:
    """A merged gate|up layer's format: block fp8 only where `width` (each part's) is a multiple of 128, else
    full precision (None: the loader dequantizes the checkpoint's fp8 into it). For a layer that may fall back
    rather than refuse the model: GLM-4.5-Air's one leading dense MLP is 10944 wide."""
    if quantization == "fp8_block" and width % BLOCK:
        return None
    return quantization


def check_block_fp8_layout(widths: Mapping[str, int]) -> None:
    """On the GPU a block-fp8 checkpoint's projections stay fp8 in merged layers (q|k|v, gate|up), whose 128x128
    scale blocks cannot straddle two projections: every merged part (named by the config fields it comes from)
    must be a multiple of 128 wide. ValueError naming them otherwise, at start-up rather than mid-load."""
    bad = {name: width for name, width in widths.items() if width % BLOCK}
    if bad:
        parts = ", ".join(f"{name} = {width}" for name, width in bad.items())
        raise ValueError(
            f"a block-fp8 checkpoint (weight_block_size [128, 128]) on the GPU needs each part of its merged "
            f"projections to be a multiple of {BLOCK} wide: {parts} is not (the scale blocks would straddle two "
            "projections); on the CPU such checkpoints are dequantized at load and run"
        )


def check_block_fp8_tensor_parallel(rank_shares: Mapping[str, Tuple[int, ...]]) -> None:
    """With --tp-size > 1 each rank loads its share of every merged part (``model_config.block_fp8_rank_shares``);
    a share that is not whole 128-row blocks would cut the checkpoint's scale blocks between two ranks. ValueError
    naming --tp-size and the parts, at start-up rather than mid-load."""
    bad = {name: shares for name, shares in rank_shares.items() if any(share % BLOCK for share in shares)}
    if bad:
        tp_size = len(next(iter(bad.values())))
        parts = ", ".join(f"{name} ({'/'.join(str(share) for share in shares)})" for name, shares in bad.items())
        raise ValueError(
            f"--tp-size {tp_size}: a block-fp8 checkpoint (weight_block_size [128, 128]) on the GPU needs each "
            f"rank's share of its merged projections to be a multiple of {BLOCK} rows; the shares of {parts} are "
            "not (a scale block would be cut between two ranks); choose a --tp-size that splits them into whole "
            "blocks"
        )
