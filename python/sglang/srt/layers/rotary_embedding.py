"""Rotary position embedding (rotate-half / NeoX layout), every rope type transformers knows.

The inverse frequencies come from transformers' own rope initialisers, so llama3, yarn, linear and
dynamic scaling match the reference exactly; cos/sin are precomputed for every position once. With a
``partial_rotary_factor`` below one (Phi-4-mini: 0.75) only the first ``rotary_dim`` features of each head
rotate (rotate-half within them) and the rest pass through, as transformers' Phi-3 does. ``longrope``'s
tables are its short factors (and its attention factor): what transformers computes while a sequence is no
longer than ``original_max_position_embeddings``, the context ModelConfig allows for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sglang.srt.configs.rope import rope_parameters as _rope_parameters
from sglang.srt.layers import kernel_dispatch
from sglang.srt.layers.layernorm import gemma_rms_normed, rms_normed


def rotary_dim(config: PretrainedConfig, head_dim: int) -> int:
    """How many features of each head rotate: head_dim times the rope's partial_rotary_factor (transformers'
    rule, int() truncating), all of them by default."""
    factor = _rope_parameters(config).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return int(head_dim * (1.0 if factor is None else factor))


def compute_inv_freq(
    config: PretrainedConfig, head_dim: int, layer_type: Optional[str] = None
) -> Tuple[torch.Tensor, float]:
    """(inverse frequencies, attention scaling of cos/sin); ``head_dim`` is the rotating width (rotary_dim),
    ``layer_type`` the kind of layer whose parameters apply (configs keyed by layer type: Gemma 3)."""
    params = _rope_parameters(config, layer_type)
    rope_type = params.get("rope_type", "default")
    # A GGUF's rope_freqs.weight (model_loader/gguf_config.py): per-pair factors dividing the base frequencies.
    factors = getattr(config, "rope_freq_factors", None)
    if factors is not None and rope_type != "default":
        raise ValueError(f"rope_freq_factors with rope type {rope_type!r}: the factors are the whole scaling")
    if rope_type == "default":
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        if factors is not None:
            if len(factors) != inv_freq.shape[0]:
                raise ValueError(
                    f"rope_freq_factors has {len(factors)} entries, expected head_dim / 2 = {len(inv_freq)}"
                )
            inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float)
        return inv_freq, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope type {rope_type!r} is not supported")
    if layer_type is not None:
        return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", layer_type=layer_type)
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class FusedSetKVBufferArg:
    """Where rotary also stores this step's K/V (SGLang's name): the rows go to the layer's pool
    buffers at ``cache_loc`` in the same kernel, and attention runs with ``save_kv_cache=False``."""

    value: torch.Tensor  # [T, Hkv * Dv], may be a strided view of the qkv output
    k_buffer: torch.Tensor  # [slots, Hkv, D], each slot's row contiguous
    v_buffer: torch.Tensor  # [slots, Hkv, Dv]
    cache_loc: torch.Tensor  # [T] slot per token
    # (weight, eps): each value row is RMS-normed first, in place, then stored (MLA's kv_a_layernorm of the latent)
    value_norm: Optional[Tuple[torch.Tensor, float]] = None


@dataclass(frozen=True)
class QKNorm:
    """A per-head RMSNorm of q and k before rotary (Qwen3, GLM-4.5 with use_qk_norm, Gemma 3): on the GPU the rotary
    kernel applies it, one kernel where three were (Gemma's two norms in torch: twenty-one)."""

    q_weight: torch.Tensor  # [head_dim]
    k_weight: torch.Tensor  # [head_dim]
    eps: float
    unit_offset: bool = False  # Gemma's RMSNorm: the scale is (1 + w), the fp32 product rounded once

    def normed(self, heads: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The norm of each row of ``heads`` [..., head_dim] in torch, rounded as the family's RMSNorm."""
        return (gemma_rms_normed if self.unit_offset else rms_normed)(heads, weight, self.eps)


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        head_dim: int,
        max_position: int,
        dtype: torch.dtype,
        interleaved: bool = False,
        layer_type: Optional[str] = None,
    ) -> None:
        """`interleaved`: rotate the pairs (x0, x1), (x2, x3), ... (DeepSeek's layout) instead of (x_i, x_{i+D/2}).
        `layer_type`: the rope parameters of that kind of layer (see configs/rope.py:rope_parameters)."""
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim(config, head_dim)  # the leading features that rotate; the rest pass
        self.interleaved = interleaved
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= head_dim or (interleaved and self.rotary_dim != head_dim):
            raise ValueError(f"partial_rotary_factor gives rotary_dim {self.rotary_dim} for head_dim {head_dim}")
        device = torch.empty(0).device  # the caller's `with torch.device(...)`; the math runs on the CPU
        with torch.device("cpu"):
            inv_freq, scaling = compute_inv_freq(config, self.rotary_dim, layer_type)
            if inv_freq.shape[0] * 2 != self.rotary_dim:
                raise ValueError(f"rope gives {inv_freq.shape[0]} frequencies for rotary_dim {self.rotary_dim}")
            freqs = torch.arange(max_position, dtype=torch.float)[:, None] * inv_freq.cpu()[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            # Cast like the reference does (fp32 math, then the activation dtype).
            cos, sin = (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)
        self.register_buffer("cos_cache", cos.to(device), persistent=False)
        self.register_buffer("sin_cache", sin.to(device), persistent=False)

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        fused_set_kv_buffer_arg: Optional[FusedSetKVBufferArg] = None,
        qk_norm: Optional[QKNorm] = None,
        query_absorb=None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq * D], k: [T, Hkv * D] (or [T, H, D] views, e.g. the rope part of each head); returns rotated
        q, k (on the GPU rotated in place, one kernel for both, interleaved pairs too).
        With ``fused_set_kv_buffer_arg`` the rotated K and the given V are also written to the pool; with
        ``qk_norm`` each head of q and k is RMS-normed (in place) before it rotates; with ``query_absorb`` (a
        head_matmul.HeadMatmul, MLA's q_nope through W_UK) its product is written too (on the GPU by the same
        kernel)."""
        if kernel_dispatch.runs_kernel(q):
            from sglang.srt.layers.fused_elementwise import apply_rotary_inplace

            apply_rotary_inplace(
                positions,
                q,
                k,
                self.cos_cache,
                self.sin_cache,
                self.head_dim,
                kv_store=fused_set_kv_buffer_arg,
                rotary_dim=self.rotary_dim,
                interleaved=self.interleaved,
                qk_norm=qk_norm,
                query_absorb=query_absorb,
            )
            return q, k
        if query_absorb is not None:
            query_absorb.reference()
        if qk_norm is not None:  # per head, in place on the (possibly strided) views, as the GPU kernel does
            for x, weight in ((q, qk_norm.q_weight), (k, qk_norm.k_weight)):
                heads = x.view(x.shape[0], -1, self.head_dim)
                heads.copy_(qk_norm.normed(heads, weight))
        q, k = self._forward_torch(positions, q, k)
        if fused_set_kv_buffer_arg is not None:
            arg = fused_set_kv_buffer_arg
            if arg.value_norm is not None:
                arg.value.copy_(rms_normed(arg.value, *arg.value_norm))
            arg.k_buffer[arg.cache_loc] = k.view(k.shape[0], *arg.k_buffer.shape[1:]).to(arg.k_buffer.dtype)
            arg.v_buffer[arg.cache_loc] = arg.value.view(k.shape[0], *arg.v_buffer.shape[1:]).to(arg.v_buffer.dtype)
        return q, k

    def _forward_torch(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos_cache[positions].unsqueeze(1)
        sin = self.sin_cache[positions].unsqueeze(1)
        qs = q.reshape(q.shape[0], -1, self.head_dim)
        ks = k.reshape(k.shape[0], -1, self.head_dim)
        if self.interleaved:
            return rotate_pairs(qs, cos, sin).view(q.shape), rotate_pairs(ks, cos, sin).view(k.shape)
        return self._rotate(qs, cos, sin).view(q.shape), self._rotate(ks, cos, sin).view(k.shape)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half on the first rotary_dim features of each head [T, H, D]; the others pass unchanged."""
        if self.rotary_dim == self.head_dim:
            return x * cos + rotate_half(x) * sin
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary on interleaved pairs (x_2i, x_2i+1) by angle i, as transformers' DeepSeek-V3
    (`apply_rotary_pos_emb_interleave`) computes it; the result is laid out de-interleaved (all first
    coordinates, then all second ones). Queries and keys get the same layout, so their dot products are those
    of the pairs rotated in place (DeepSeek-V2's complex-number form)."""
    half = x.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]  # the cache holds cat(freqs, freqs)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


_ROPE_CACHE: dict = {}


def get_rope(
    config: PretrainedConfig,
    head_dim: int,
    max_position: int,
    dtype: torch.dtype,
    interleaved: bool = False,
    layer_type: Optional[str] = None,
) -> RotaryEmbedding:
    """One RotaryEmbedding per distinct geometry: its cos/sin tables (MBs at 128k context) are shared by all layers.
    `layer_type`: for configs with rope parameters per kind of layer (Gemma 3), that kind's."""
    device = torch.empty(0).device  # honours the caller's `with torch.device(...)`
    # Everything compute_inv_freq reads: the rope parameters and a GGUF's per-pair frequency factors.
    rope = (
        repr(sorted(_rope_parameters(config, layer_type).items())),
        getattr(config, "rope_freq_factors", None),
        rotary_dim(config, head_dim),
    )
    key = (head_dim, max_position, dtype, str(device), rope, interleaved)
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = RotaryEmbedding(config, head_dim, max_position, dtype, interleaved, layer_type)
    return _ROPE_CACHE[key]
