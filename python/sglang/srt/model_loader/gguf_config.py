"""A transformers config built from a GGUF file's metadata (fast: no tensor is read)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Optional

import gguf
from transformers import PretrainedConfig
from transformers.models.llama import LlamaConfig
from transformers.models.qwen2 import Qwen2Config
from transformers.models.qwen3 import Qwen3Config
from transformers.models.qwen3_moe import Qwen3MoeConfig

from sglang.srt.model_loader.gguf_index import GGUFIndex, read_gguf_index

# GGUF architecture -> (HF config class, HF architecture name)
GGUF_ARCHS = {
    "llama": (LlamaConfig, "LlamaForCausalLM"),
    "qwen2": (Qwen2Config, "Qwen2ForCausalLM"),
    "qwen3": (Qwen3Config, "Qwen3ForCausalLM"),
    "qwen3moe": (Qwen3MoeConfig, "Qwen3MoeForCausalLM"),
}


@lru_cache(maxsize=4)
def open_gguf(path: str) -> GGUFIndex:
    """The file's metadata and tensor table, read once per process (the config and the weights share it)."""
    return read_gguf_index(path)


def config_from_gguf(path: str) -> PretrainedConfig:
    reader = open_gguf(path)
    arch = reader.field("general.architecture")
    if arch not in GGUF_ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHS)})")
    cls, hf_arch = GGUF_ARCHS[arch]
    a = lambda key, default=None: reader.field(f"{arch}.{key}", default)  # noqa: E731
    num_heads = a("attention.head_count")
    hidden = a("embedding_length")
    tensor_names = {t.name for t in reader.tensors}
    vocab = a("vocab_size") or len(reader.field("tokenizer.ggml.tokens", []))
    kwargs = dict(
        architectures=[hf_arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=a("feed_forward_length"),
        num_hidden_layers=a("block_count"),
        num_attention_heads=num_heads,
        num_key_value_heads=a("attention.head_count_kv", num_heads),
        head_dim=a("attention.key_length", hidden // num_heads),
        max_position_embeddings=a("context_length", 4096),
        rms_norm_eps=a("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=a("rope.freq_base", 10000.0),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=reader.field("tokenizer.ggml.bos_token_id"),
        eos_token_id=reader.field("tokenizer.ggml.eos_token_id"),
    )
    if arch == "qwen3moe":
        kwargs.update(
            num_experts=a("expert_count"),
            num_experts_per_tok=a("expert_used_count"),
            moe_intermediate_size=a("expert_feed_forward_length"),
            norm_topk_prob=True,
        )
    _refuse_unrun_metadata(arch, a, kwargs["head_dim"])
    rope_scaling = _rope_scaling(arch, a)
    if rope_scaling is not None:
        kwargs["rope_scaling"] = rope_scaling
    config = cls(**kwargs)
    config.gguf_architecture = arch
    config.rope_freq_factors = _rope_freq_factors(reader)
    return config


def _rope_scaling(arch: str, a: Callable[..., Any]) -> Optional[dict]:
    """The `{arch}.rope.scaling.*` metadata as transformers' rope_scaling (llama.cpp's converter writes it from the
    HF config's): linear and yarn, whose llama.cpp defaults (beta_fast 32, beta_slow 1, the attention factor
    0.1 ln(factor) + 1) are transformers' own. Any other type, or a yarn knob transformers has no equal for, is
    refused naming its key: the model would load and answer differently."""
    kind = a("rope.scaling.type")
    if kind in (None, "none"):
        return None
    key = f"{arch}.rope.scaling.type"
    if kind not in ("linear", "yarn"):
        raise ValueError(f"GGUF {key} = {kind!r} is not supported (linear, yarn and none are)")
    factor = a("rope.scaling.factor")
    if not factor or factor <= 0:
        raise ValueError(f"GGUF {key} = {kind!r} needs {arch}.rope.scaling.factor > 0, got {factor!r}")
    scaling = {"rope_type": kind, "factor": float(factor)}
    if kind == "yarn":
        original = a("rope.scaling.original_context_length")
        if not original:
            raise ValueError(f"GGUF {key} = 'yarn' needs {arch}.rope.scaling.original_context_length")
        scaling["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            value = a(f"rope.scaling.{gguf_key}")
            if value is not None:
                scaling[hf_key] = float(value)
    return scaling


def _refuse_unrun_metadata(arch: str, a: Callable[..., Any], head_dim: int) -> None:
    """Metadata that changes what the model computes in ways the config we build would not carry: refused by key,
    before any tensor is read. llama.cpp's neutral values pass (an attention factor of 1, the default ext factor)."""
    neutral = {
        "rope.scaling.attn_factor": (1.0,),
        "rope.scaling.yarn_attn_factor": (1.0,),
        "rope.scaling.yarn_ext_factor": (-1.0, 1.0),  # -1: llama.cpp's "the default" (1 under yarn)
    }
    for key, allowed in neutral.items():
        value = a(key)
        if value is not None and float(value) not in allowed:
            raise ValueError(f"GGUF {arch}.{key} = {value!r} is not supported (only {allowed[0]!r})")
    for key in ("rope.scaling.yarn_log_multiplier", "rope.scaling.alpha", "attention.sliding_window"):
        value = a(key)
        if value not in (None, 0):
            raise ValueError(f"GGUF {arch}.{key} = {value!r} is not supported for a {arch} GGUF here")
    rotary = a("rope.dimension_count")
    if rotary is not None and rotary != head_dim:
        raise ValueError(
            f"GGUF {arch}.rope.dimension_count = {rotary} rotates part of each head ({head_dim} values); "
            "not supported for a GGUF here"
        )


def _rope_freq_factors(reader: GGUFIndex) -> Any:
    """llama.cpp stores Llama-3.1+ rope scaling as `rope_freqs.weight`: one factor per rotary pair that divides
    the base inverse frequency (its rope kernels compute theta = pos * base^(-2i/d) / factor[i]); the factors
    encode transformers' llama3 rope_type. A tuple of floats (a handful: head_dim / 2), or None."""
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
                raise ValueError(f"GGUF rope_freqs.weight of type {tensor.tensor_type.name}: expected F32")
            return tuple(float(x) for x in tensor.data.reshape(-1))
    return None
