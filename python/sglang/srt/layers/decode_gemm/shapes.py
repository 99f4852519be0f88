"""The weight shapes a model's linear layers have on one tensor-parallel rank: what a tuned table must name."""

from __future__ import annotations

from transformers import PretrainedConfig

from sglang.srt.configs.deepseek import uses_mla
from sglang.srt.configs.model_config import attention_head_dim, num_routed_experts, total_num_kv_heads
from sglang.srt.distributed.partition import HeadPartition, shard_range
from sglang.srt.layers.linear import stacked_layout


def projection_shapes(
    config: PretrainedConfig, tp_size: int = 1, tp_rank: int = 0, block_fp8: bool = False
) -> dict[str, tuple[int, int]]:
    """``(N, K)`` of qkv_proj, o_proj and (dense models) gate_up_proj / down_proj on rank ``tp_rank``, as
    ``srt/layers/linear.py`` shards them (KV heads replicated when they are fewer than the ranks). MoE experts
    run in the fused-MoE kernel and lm_head in the logits processor: neither goes through the table.
    ``block_fp8``: the shapes of a block-fp8 checkpoint's layers (MLA's stacked projection in whole blocks)."""
    if uses_mla(config):
        return mla_projection_shapes(config, tp_size, tp_rank, block_fp8)
    heads = HeadPartition.for_rank(config.num_attention_heads, total_num_kv_heads(config), tp_size, tp_rank)
    head_dim = attention_head_dim(config)
    hidden = config.hidden_size
    shapes = {
        "qkv": ((heads.num_q_heads + 2 * heads.num_kv_heads) * head_dim, hidden),
        "o": (hidden, heads.num_q_heads * head_dim),
    }
    if num_routed_experts(config) == 0:
        start, end = shard_range(config.intermediate_size, tp_size, tp_rank)
        shapes["gate_up"] = (2 * (end - start), hidden)
        shapes["down"] = (hidden, end - start)
    return shapes


def mla_projection_shapes(
    config: PretrainedConfig, tp_size: int = 1, tp_rank: int = 0, block_fp8: bool = False
) -> dict[str, tuple[int, int]]:
    """The DeepSeek-V2/V3 family (``models/deepseek_v2.py``): the query projection (``q``, or ``q_a`` then ``q_b``
    with a q LoRA rank) and the latent KV projection (``kv_a``, replicated) as one GEMM (``q_kv_a``, or ``q_a_kv_a``
    then ``q_b``), ``o``; the leading dense layers' MLP
    (``gate_up`` / ``down``) and the shared experts' (``shared_gate_up`` / ``shared_down``). ``kv_b_proj`` is never
    run as a layer (the attention absorbs its weight) and the routed experts are fused-MoE's."""
    start, end = shard_range(config.num_attention_heads, tp_size, tp_rank)
    heads, hidden = end - start, config.hidden_size
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    kv_a = config.kv_lora_rank + config.qk_rope_head_dim
    if config.q_lora_rank is None:
        shapes = {"q_kv_a": (stacked_layout([heads * qk, kv_a], block_fp8)[1], hidden)}
    else:
        q_a_kv_a = stacked_layout([config.q_lora_rank, kv_a], block_fp8)[1]
        shapes = {"q_a_kv_a": (q_a_kv_a, hidden), "q_b": (heads * qk, config.q_lora_rank)}
    shapes["o"] = (hidden, heads * config.v_head_dim)
    mlps = {}
    if (config.first_k_dense_replace or 0) > 0 or num_routed_experts(config) == 0:
        mlps[""] = config.intermediate_size
    if getattr(config, "n_shared_experts", None):
        mlps["shared_"] = config.moe_intermediate_size * config.n_shared_experts
    for prefix, intermediate in mlps.items():
        lo, hi = shard_range(intermediate, tp_size, tp_rank)
        shapes[f"{prefix}gate_up"] = (2 * (hi - lo), hidden)
        shapes[f"{prefix}down"] = (hidden, hi - lo)
    return shapes
