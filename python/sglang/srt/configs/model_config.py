"""ModelConfig: the facts about a model that the runtime needs, from its HF config (or GGUF metadata)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from transformers import AutoConfig, PretrainedConfig

from sglang.srt.configs.deepseek import (
    DEEPSEEK_V3_CONFIG_ALIASES,
    UnsupportedModelError,
    check_deepseek_config,
    uses_mla,
)
from sglang.srt.configs.gemma import check_gemma_config, is_gemma
from sglang.srt.configs.glm4_moe import GLM4_MOE_ARCH, check_glm4_moe_config
from sglang.srt.configs.quantization_config import (
    CheckpointQuantization,
    UnsupportedQuantization,
    check_block_fp8_layout,
    check_block_fp8_tensor_parallel,
    check_int4_groups_on_device,
    checkpoint_quantization,
    linear_weight_format,
)
from sglang.srt.configs.rope import EXACT_ROPE_TYPES, longrope_context_limit, rope_parameters
from sglang.srt.configs.sliding_window import layer_sliding_windows
from sglang.srt.distributed.partition import HeadPartition, shard_range
from sglang.srt.model_executor.pool_configurator import KVGeometry
from sglang.srt.model_loader.model_source import ModelSource

_DTYPE_NAMES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(requested: str, config: PretrainedConfig, device: str) -> torch.dtype:
    if requested != "auto":
        return _DTYPE_NAMES[requested]
    if device == "cpu":
        # fp32 on the CPU: fast enough for small models and bit-comparable with transformers' reference.
        return torch.float32
    config_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _DTYPE_NAMES.get(config_dtype)
    if config_dtype in (torch.float16, torch.bfloat16):
        return config_dtype
    return torch.bfloat16


def resolve_kv_dtype(requested: str, model_dtype: torch.dtype) -> torch.dtype:
    if requested == "auto":
        return model_dtype
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "fp8_e4m3": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
    }[requested]


def check_online_quantization(method: str, config: PretrainedConfig, dtype: torch.dtype, device: str) -> None:
    """--quantization METHOD quantizes a full-precision checkpoint's dense linear layers while loading;
    ValueError naming the flag where that cannot be done."""
    if getattr(config, "quantization_config", None):
        kind = dict(config.quantization_config).get("quant_method", "quantized")
        raise ValueError(
            f"--quantization {method}: the checkpoint is already quantized ({kind}); online quantization "
            "takes a full-precision checkpoint"
        )
    if num_routed_experts(config) > 0:
        raise ValueError(
            f"--quantization {method} quantizes dense models' linear layers; this is a MoE model (its experts' "
            "formats are --kt-method's)"
        )
    if device == "cuda" and dtype != torch.bfloat16:
        raise ValueError(
            f"--quantization {method} on the GPU needs --dtype bfloat16 (the fp8 GEMM's row-wise scales "
            f"produce bf16), got {dtype}"
        )


def attention_head_dim(config: PretrainedConfig) -> int:
    """Width of one attention head: the config's head_dim, else hidden_size / heads (the one rule
    ModelConfig and the model code share)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def total_num_kv_heads(config: PretrainedConfig) -> int:
    """KV heads of the whole model (before the tensor-parallel split); MHA models name none."""
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


# What families call their routed experts per MoE layer: Qwen-MoE `num_experts`, DeepSeek/GLM/Kimi
# `n_routed_experts`, Mixtral `num_local_experts` (transformers maps some of them onto each other).
ROUTED_EXPERT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")


def num_routed_experts(config: PretrainedConfig) -> int:
    """Routed experts per MoE layer (0 for a dense model), whichever name the config uses."""
    text = getattr(config, "text_config", None) or config
    for name in ROUTED_EXPERT_FIELDS:
        value = getattr(text, name, None)
        if value:
            return int(value)
    return 0


def attention_kind(config: PretrainedConfig) -> str:
    """ "mla" for multi-head latent attention (DeepSeek-V2/V3, Kimi-K2: the config has kv_lora_rank), else "mha"."""
    text = getattr(config, "text_config", None) or config
    return "mla" if uses_mla(text) else "mha"


# Per-architecture fields that transformers 5.24's modeling files read differently from how our shared Llama
# code would (docs/model_support.md has the whole table):
# - partial_rotary_factor rotates part of each head only in Phi-3 (Llama-family files ignore it for the
#   default rope and fail for scaled ones);
# - attention_bias is never read by Mistral's, Mixtral's or Qwen2-MoE's attention (fixed biases), but
#   LlamaAttention would add q/k/v/o biases for it;
# - sliding_window is never applied by Llama's or OLMoE's masks (OLMoE passes it to flash attention only).
PARTIAL_ROTARY_ARCHITECTURES = ("Phi3ForCausalLM", "Glm4MoeForCausalLM")
ATTENTION_BIAS_IGNORED = ("MistralForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM")
SLIDING_WINDOW_IGNORED = ("LlamaForCausalLM", "OlmoeForCausalLM")


Q_HEADS_PART = "num_attention_heads x head_dim"
KV_HEADS_PART = "num_key_value_heads x head_dim"
# MLA: q_b_proj (or q_proj) rows and o_proj's input columns, split by whole heads (models/deepseek_v2.py).
MLA_Q_HEADS_PART = "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)"
MLA_O_HEADS_PART = "num_attention_heads x v_head_dim"
_SPLIT_BY_KV_HEADS = (KV_HEADS_PART,)
_SPLIT_BY_QUERY_HEADS = (Q_HEADS_PART, MLA_Q_HEADS_PART, MLA_O_HEADS_PART)


def block_fp8_rank_shares(
    widths: Dict[str, int], num_heads: int, kv_heads: int, tp_size: int
) -> Dict[str, Tuple[int, ...]]:
    """Each part's rows (or a row-parallel layer's columns) on every tensor-parallel rank, split as the layers split
    them: whole heads by distributed/partition.HeadPartition (KV heads replicated past their count; MLA's heads,
    kv_heads = num_heads, by shard_range), the MLP widths by shard_range. A rank's merged layer holds its shares back
    to back, so each must be whole 128-row blocks (demanded of MLA's unmerged head parts too: every share of an
    uneven split, the last included, is rarely whole blocks when the others are)."""
    partitions = [HeadPartition.for_rank(num_heads, kv_heads, tp_size, r) for r in range(tp_size)]
    shares: Dict[str, Tuple[int, ...]] = {}
    for name, width in widths.items():
        if name in _SPLIT_BY_QUERY_HEADS:
            shares[name] = tuple(p.num_q_heads * (width // num_heads) for p in partitions)
        elif name in _SPLIT_BY_KV_HEADS:
            shares[name] = tuple(p.num_kv_heads * (width // kv_heads) for p in partitions)
        else:
            shares[name] = tuple(end - start for start, end in (shard_range(width, tp_size, r) for r in range(tp_size)))
    return shares


def block_fp8_mlp_widths(text: PretrainedConfig, architecture: str) -> Dict[str, int]:
    """The merged MLP parts that keep a block-fp8 checkpoint's weights on the GPU, named by the config fields they
    come from: the dense gate|up, the routed experts' gate|up (w13) and the shared experts' gate|up. GLM's leading
    dense MLPs are not among them: one whose width is not block-aligned (GLM-4.5-Air's 10944) keeps full
    precision instead (block_aligned_format)."""
    widths: Dict[str, int] = {}
    if architecture != GLM4_MOE_ARCH:
        widths["intermediate_size"] = getattr(text, "intermediate_size", 0) or 0
    moe_width = getattr(text, "moe_intermediate_size", 0) or 0
    if moe_width and num_routed_experts(text):
        widths["moe_intermediate_size"] = moe_width
        shared = getattr(text, "n_shared_experts", 0) or 0
        if shared:
            widths["n_shared_experts x moe_intermediate_size"] = shared * moe_width
    shared_width = getattr(text, "shared_expert_intermediate_size", 0) or 0  # Qwen2-MoE's one shared expert
    if shared_width:
        widths["shared_expert_intermediate_size"] = shared_width
    return widths


def block_fp8_merged_widths(text: PretrainedConfig, head_dim: int, kv_heads: int, architecture: str) -> Dict[str, int]:
    """The width of each part of the merged projections that keep a block-fp8 checkpoint's weights on the GPU,
    named by the config fields it comes from (check_block_fp8_layout): q|k|v and the MLP parts
    (block_fp8_mlp_widths)."""
    return {
        Q_HEADS_PART: text.num_attention_heads * head_dim,
        KV_HEADS_PART: kv_heads * head_dim,
        **block_fp8_mlp_widths(text, architecture),
    }


def check_block_fp8_split(
    text: PretrainedConfig, kind: str, head_dim: int, v_head_dim: int, kv_heads: int, architecture: str, tp_size: int
) -> None:
    """A block-fp8 checkpoint on the GPU: its merged parts in whole 128-row blocks (check_block_fp8_layout), and with
    --tp-size > 1 every rank's share of every split part too (check_block_fp8_tensor_parallel), at start-up, before
    any weight is read (the loader would stop at the first scale that straddles). MLA's query and output head parts
    are single layers: only their tensor-parallel shares matter."""
    if kind == "mla":
        mlp = block_fp8_mlp_widths(text, architecture)
        check_block_fp8_layout(mlp)
        heads = text.num_attention_heads
        widths = {MLA_Q_HEADS_PART: heads * head_dim, MLA_O_HEADS_PART: heads * v_head_dim, **mlp}
    else:
        widths = block_fp8_merged_widths(text, head_dim, kv_heads, architecture)
        check_block_fp8_layout(widths)
    if tp_size > 1:
        check_block_fp8_tensor_parallel(block_fp8_rank_shares(widths, text.num_attention_heads, kv_heads, tp_size))


def architecture_of(config: PretrainedConfig) -> str:
    """The model class a config names (`architectures`); a config without one (made in code, or an old
    config.json) gets its model_type's causal-LM class as transformers' Auto classes map it, never a guess."""
    names = getattr(config, "architectures", None)
    if names:
        return names[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UnsupportedModelError(f"the config names no architectures and its model_type={model_type!r} no model")
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]


def check_architecture_fields(config: PretrainedConfig) -> None:
    """Refuse, naming the field, what the architecture's transformers modeling file computes differently from
    our code for it (MLA DeepSeek configs: configs/deepseek.py)."""
    arch = architecture_of(config)
    params = rope_parameters(config)
    rope_type = params.get("rope_type", "default")
    if rope_type not in EXACT_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_scaling rope_type={rope_type!r} is not supported (supported: {', '.join(EXACT_ROPE_TYPES)})"
        )
    if uses_mla(config):
        return  # deepseek_v2.py's own attention; check_deepseek_config refuses its other fields
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0) and arch not in PARTIAL_ROTARY_ARCHITECTURES:
        raise UnsupportedModelError(
            f"partial_rotary_factor={partial} is not supported for {arch} (transformers rotates every feature "
            "of its heads, or fails with a scaled rope)"
        )
    if getattr(config, "attention_bias", False) and arch in ATTENTION_BIAS_IGNORED:
        raise UnsupportedModelError(
            f"attention_bias=True is not supported for {arch} (transformers' {arch} never reads it: its "
            "projections' biases are fixed)"
        )
    if getattr(config, "sliding_window", None) and arch in SLIDING_WINDOW_IGNORED:
        raise UnsupportedModelError(
            f"sliding_window={config.sliding_window} is not supported for {arch} (transformers' {arch} attends "
            "to every earlier token: its causal mask has no window)"
        )
    try:  # each layer's window as the model will build it (layer_types, sliding_window), refused here by name
        layer_sliding_windows(config)
    except ValueError as e:
        raise UnsupportedModelError(str(e)) from e


def check_model_supported(config: PretrainedConfig) -> None:
    """Refuse, naming the field, a config we cannot run exactly (before any weight loads)."""
    text = getattr(config, "text_config", None) or config
    check_deepseek_config(text)
    check_glm4_moe_config(text)
    check_gemma_config(config)  # Gemma's activation field and values are its own (GeGLU): checked there
    check_architecture_fields(text)
    # Every other MLP here is SwiGLU without biases (LlamaMLP, the MoE experts): another activation or an MLP
    # bias would load and answer wrongly.
    act = getattr(text, "hidden_act", None) or getattr(text, "hidden_activation", None) or "silu"
    if not is_gemma(text) and act not in ("silu", "swish"):
        raise UnsupportedModelError(f"hidden_act={act!r} is not supported (silu)")
    if getattr(text, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=True is not supported (the MLP layers have no bias)")
    try:  # the checkpoint's quantization_config: a format we run, or refused by name before any weight is read
        checkpoint_quantization(config)
    except UnsupportedQuantization as e:
        raise UnsupportedModelError(str(e)) from e


def load_hf_config(source: ModelSource) -> PretrainedConfig:
    """The HF config of a model directory or GGUF file. Never runs a checkpoint's own Python code: a
    model_type transformers does not know but whose config class it has under another name (Kimi-K2's
    `kimi_k2` is DeepSeek-V3's config) is read with that class."""
    if source.kind == "gguf":
        from sglang.srt.model_loader.gguf_config import config_from_gguf

        return config_from_gguf(source.path)
    config_file = os.path.join(source.path, "config.json")
    raw = {}
    if os.path.isfile(config_file):
        with open(config_file) as f:
            raw = json.load(f)
    alias = DEEPSEEK_V3_CONFIG_ALIASES.get(raw.get("model_type"))
    if alias is not None:
        from transformers import CONFIG_MAPPING

        raw = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map")}
        return CONFIG_MAPPING[alias].from_dict(raw)
    return AutoConfig.from_pretrained(source.path)


@dataclass(frozen=True)
class ModelConfig:
    hf_config: PretrainedConfig
    source: Optional[ModelSource]
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    context_len: int
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    eos_token_ids: Tuple[int, ...]
    quantization: Optional[str] = None  # --quantization: the dense linear layers' weight format
    checkpoint_quantization: Optional[CheckpointQuantization] = None  # the checkpoint's own format
    # "mha" (K and V per KV head) or "mla" (one latent row per token; head_dim / v_head_dim are then the
    # query-key width qk_nope + qk_rope and the value width of each head after decompression).
    attention: str = "mha"
    kv_lora_rank: int = 0  # MLA only: the latent width (512 for DeepSeek-V2/V3)
    qk_nope_head_dim: int = 0  # MLA only: the part of each head's query/key without rotary
    qk_rope_head_dim: int = 0  # MLA only: the rotary part, its key shared by all heads
    # One entry per decoder layer: its sliding window (> 0) or NO_WINDOW (configs/sliding_window.py).
    sliding_windows: Tuple[int, ...] = ()

    @classmethod
    def from_hf_config(
        cls,
        hf_config: PretrainedConfig,
        source: Optional[ModelSource] = None,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        device: str = "cpu",
        context_length: Optional[int] = None,
        quantization: Optional[str] = None,
        tp_size: int = 1,
    ) -> "ModelConfig":
        """``tp_size``: --tp-size, for the checks of how a block-fp8 checkpoint's layers split over the ranks."""
        check_model_supported(hf_config)
        text = getattr(hf_config, "text_config", None) or hf_config
        kind = attention_kind(hf_config)
        if kind == "mla":
            mla = dict(
                kv_lora_rank=text.kv_lora_rank,
                qk_nope_head_dim=text.qk_nope_head_dim,
                qk_rope_head_dim=text.qk_rope_head_dim,
            )
            head_dim, v_head_dim = text.qk_nope_head_dim + text.qk_rope_head_dim, text.v_head_dim
            kv_heads = text.num_attention_heads  # every head has its own K/V (decompressed from the latent)
        else:
            mla = {}
            head_dim = v_head_dim = attention_head_dim(text)
            kv_heads = total_num_kv_heads(text)
        derived_ctx = getattr(text, "max_position_embeddings", None) or 4096
        if context_length is not None and context_length > derived_ctx:
            raise ValueError(
                f"--context-length {context_length} is longer than the model's max_position_embeddings {derived_ctx}"
            )
        longrope_limit = longrope_context_limit(text)
        if longrope_limit is not None and longrope_limit < derived_ctx:
            # Past it transformers re-rotates the whole sequence, cached keys included, with the long factors:
            # a KV cache cannot follow that, so sequences stop at it (the short factors, exact).
            if context_length is not None and context_length > longrope_limit:
                raise ValueError(
                    f"--context-length {context_length}: a longrope model runs exactly up to its "
                    f"original_max_position_embeddings {longrope_limit} (the long factors are not supported)"
                )
            derived_ctx = longrope_limit
        eos = hf_config.eos_token_id
        eos_ids = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
        model_dtype = resolve_dtype(dtype, hf_config, device)
        if quantization is not None:
            check_online_quantization(quantization, hf_config, model_dtype, device)
        checkpoint_format = checkpoint_quantization(hf_config)  # refuses a format we do not run
        check_int4_groups_on_device(checkpoint_format, device)
        architecture = architecture_of(hf_config)
        quantization = quantization or linear_weight_format(checkpoint_format, device, model_dtype, architecture)
        if quantization == "fp8_block":
            check_block_fp8_split(text, kind, head_dim, v_head_dim, kv_heads, architecture, tp_size)
        return cls(
            hf_config=hf_config,
            source=source,
            dtype=model_dtype,
            kv_cache_dtype=resolve_kv_dtype(kv_cache_dtype, model_dtype),
            context_len=context_length or derived_ctx,
            architecture=architecture,
            num_hidden_layers=text.num_hidden_layers,
            hidden_size=text.hidden_size,
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            vocab_size=text.vocab_size,
            eos_token_ids=eos_ids,
            quantization=quantization,
            checkpoint_quantization=checkpoint_format,
            attention=kind,
            sliding_windows=layer_sliding_windows(text),
            **mla,
        )

    def head_partition(self, tp_size: int = 1, tp_rank: int = 0) -> HeadPartition:
        return HeadPartition.for_rank(self.num_attention_heads, self.num_key_value_heads, tp_size, tp_rank)

    def get_num_kv_heads(self, tp_size: int = 1, tp_rank: int = 0) -> int:
        """KV heads held by one rank: split across ranks (unevenly if need be), replicated when fewer than ranks."""
        return self.head_partition(tp_size, tp_rank).num_kv_heads

    @property
    def num_window_layers(self) -> int:
        """Decoder layers that attend through a sliding window."""
        return sum(1 for w in self.sliding_windows if w > 0)

    @property
    def max_sliding_window(self) -> int:
        """The widest window of any layer (0 without windowed layers)."""
        return max((w for w in self.sliding_windows if w > 0), default=0)

    def kv_geometry(
        self, tp_size: int = 1, tp_rank: int = 0, swa_full_tokens_ratio: Optional[float] = None
    ) -> KVGeometry:
        """One rank's KV layout: what its pool allocates and its cell size. MLA: the latent rows, the same on
        every rank (all heads read them). `swa_full_tokens_ratio` (the hybrid SWA pool, engine_config decides it):
        the windowed layers keep that many tokens per token of the full-attention layers."""
        if self.is_mla:
            return KVGeometry.latent(
                self.num_hidden_layers, self.kv_lora_rank, self.qk_rope_head_dim, self.kv_cache_dtype.itemsize
            )
        return KVGeometry(
            num_layers=self.num_hidden_layers,
            kv_heads=self.get_num_kv_heads(tp_size, tp_rank),
            head_dim=self.head_dim,
            v_head_dim=self.v_head_dim,
            dtype_bytes=self.kv_cache_dtype.itemsize,
            swa_layers=self.num_window_layers if swa_full_tokens_ratio is not None else 0,
            swa_full_tokens_ratio=1.0 if swa_full_tokens_ratio is None else swa_full_tokens_ratio,
            swa_window=self.max_sliding_window if swa_full_tokens_ratio is not None else 0,
        )

    def largest_kv_geometry(self, tp_size: int = 1, swa_full_tokens_ratio: Optional[float] = None) -> KVGeometry:
        """The layout of the rank holding the most KV heads (uneven splits): it binds the token count
        every rank must share, so the planner sizes from it."""
        geometries = (self.kv_geometry(tp_size, rank, swa_full_tokens_ratio) for rank in range(tp_size))
        return max(geometries, key=lambda g: g.kv_heads)

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def is_moe(self) -> bool:
        return num_routed_experts(self.hf_config) > 0
