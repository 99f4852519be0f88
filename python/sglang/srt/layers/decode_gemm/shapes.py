"""The weight shapes a model's linear layers have on one tensor-parallel rank: what a tuned table must name."""

from __future__ import annotations

from transformers import PretrainedConfig

from sglang.srt.configs.model_config import attention_head_dim, num_routed_experts, total_num_kv_heads
from sglang.srt.distributed.partition import HeadPartition, shard_range


def projection_shapes(config: PretrainedConfig, tp_size: int = 1, tp_rank: int = 0) -> dict[str, tuple[int, int]]:
    """``(N, K)`` of qkv_proj, o_proj and (dense models) gate_up_proj / down_proj on rank ``tp_rank``, as
    ``srt/layers/linear.py`` shards them (KV heads replicated when they are fewer than the ranks). MoE experts
    run in the fused-MoE kernel and lm_head in the logits processor: neither goes through the table."""
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
