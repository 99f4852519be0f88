"""FusedMoE: the routed-experts layer of a MoE block (router logits in, expert mixture out)."""

from __future__ import annotations

from typing import Optional, Union

import torch

from sglang.srt.configs.quantization_config import CheckpointQuantization
from sglang.srt.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from sglang.srt.distributed.partition import shard_range
from sglang.srt.layers.moe.topk import select_experts
from sglang.srt.layers.moe.weight_format import SharedMLPWeights
from sglang.srt.layers.quantization import checkpoint_fp8_holder, get_moe_method
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase
from sglang.srt.layers.quantization.int4 import CHECKPOINT_CODES, CHECKPOINT_GROUP_SCALES, Int4FusedMoEMethod

# Checkpoint projection -> our shard id: w1 = gate, w3 = up (stacked into w13), w2 = down.
_CKPT_SHARDS = (("gate_proj", "w1", "w13_"), ("up_proj", "w3", "w13_"), ("down_proj", "w2", "w2_"))
# A native FP8 checkpoint's expert scale, by its name beside the weight: its layout, and the format holding it.
CHECKPOINT_SCALE_STRATEGIES = {"weight_scale_inv": "block", "weight_scale": "channel"}
INT4_KINDS = (CHECKPOINT_CODES, CHECKPOINT_GROUP_SCALES)


def moe_intermediate_partition(intermediate_size: int) -> tuple[int, int]:
    """This rank's [start, end) of every expert's intermediate dimension (tensor parallelism)."""
    return shard_range(intermediate_size, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank())


def make_moe_layer(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str) -> torch.nn.Module:
    """An empty module holding one MoE layer's expert parameters in `method`'s layout, on the current
    default device: KT's CPU experts, the KT prefill slot and its meta-device sizing all come from here."""
    layer = torch.nn.Module()
    quant = get_moe_method(method)
    quant.create_weights(layer, num_experts, hidden, inter, dtype)
    layer.quant_method = quant
    return layer


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def moe_layer_bytes(num_experts: int, hidden: int, inter: int, dtype: torch.dtype, method: str) -> int:
    """Exact parameter bytes of one MoE layer in `method`'s layout: built on the meta device (allocates nothing)."""
    with torch.device("meta"):
        return param_bytes(make_moe_layer(num_experts, hidden, inter, dtype, method))


def shard_expert_weight(weight: torch.Tensor, shard_id: str, inter_range: tuple[int, int]) -> torch.Tensor:
    """A checkpoint expert matrix cut to this rank: w1/w3 [I, H] by rows, w2 [H, I] by columns."""
    start, end = inter_range
    return weight[start:end] if shard_id in ("w1", "w3") else weight[:, start:end]


def load_expert_from_checkpoint(
    layer: torch.nn.Module,
    quant_method: FusedMoEMethodBase,
    inter_range: tuple[int, int],
    expert_id: int,
    shard_id: str,
    loaded: torch.Tensor,
    kind,
) -> None:
    """One checkpoint matrix of one expert into `layer` (a FusedMoE, or a KT wrapper's CPU layer), cut to this
    rank's `inter_range`: full precision goes through the method's quantizer; a native FP8 checkpoint's e4m3
    codes and its scale (`kind` "weight_scale_inv": per 128x128 block, cut in 128-wide blocks; "weight_scale":
    per output row or per tensor) are copied as they are, by a format that holds that layout."""
    if isinstance(kind, str) and kind in INT4_KINDS:
        _load_int4_expert(
            layer, quant_method, inter_range, expert_id, shard_id, loaded, kind == CHECKPOINT_GROUP_SCALES
        )
        return
    strategy = CHECKPOINT_SCALE_STRATEGIES.get(kind) if isinstance(kind, str) else None
    is_scale = strategy is not None
    if is_scale and not quant_method.holds_checkpoint_fp8(strategy):
        raise ValueError(
            f"{shard_id} of expert {expert_id}: the checkpoint's fp8 experts come with {kind} ({strategy} scales), "
            f"which the {quant_method.name} expert format cannot hold as they are; {checkpoint_fp8_holder(strategy)} can "
            "(with KT: --kt-method)"
        )
    if is_scale and kind == "weight_scale":  # per row: w1 / w3 rows are this rank's slice, w2's whole
        start, end = inter_range
        rows = loaded.reshape(-1)
        if rows.numel() > 1 and shard_id != "w2":
            rows = rows[start:end]
        quant_method.load_expert_checkpoint_fp8(layer, expert_id, shard_id, rows, True)
        return
    if is_scale or loaded.dtype == torch.float8_e4m3fn:
        block = quant_method.scale_row_block
        start, end = inter_range
        if start % block:  # the method's check_sizes keeps each partition's width a multiple of the block
            raise ValueError(f"expert partition {inter_range} does not fall on {block}-wide scale blocks")
        cut = (start // block, -(-end // block)) if is_scale else inter_range
        quant_method.load_expert_checkpoint_fp8(
            layer, expert_id, shard_id, shard_expert_weight(loaded, shard_id, cut), is_scale
        )
        return
    quant_method.load_expert(layer, expert_id, shard_id, shard_expert_weight(loaded, shard_id, inter_range))


def _load_int4_expert(
    layer: torch.nn.Module,
    quant_method: FusedMoEMethodBase,
    inter_range: tuple[int, int],
    expert_id: int,
    shard_id: str,
    loaded: torch.Tensor,
    is_scale: bool,
) -> None:
    """A pack-quantized expert matrix's code bytes [rows, cols/2] or group scales [rows, ceil(cols/group)] (the
    loader's int4 pass, model_loader/int4_checkpoint.py), cut to this rank: w1 / w3 by rows, w2 by whole bytes or
    whole groups of its inputs."""
    if not isinstance(quant_method, Int4FusedMoEMethod):
        raise ValueError(
            f"{shard_id} of expert {expert_id}: the checkpoint's int4 experts cannot be held as they are by the "
            f"{quant_method.name} expert format"
        )
    group, (start, end) = quant_method.group, inter_range
    if shard_id != "w2":
        part = loaded[start:end]
    elif is_scale:
        if start % group:
            raise ValueError(f"expert partition {inter_range} does not fall on the int4 scale groups of {group}")
        part = loaded[:, start // group : -(-end // group)]
    else:
        part = loaded[:, start // 2 : end // 2]  # the partition is even: INT4's check_sizes
    quant_method.load_expert_checkpoint_int4(layer, expert_id, shard_id, part, is_scale)


class FusedMoE(torch.nn.Module):
    """All experts of one MoE layer; the weight layout belongs to ``quant_method``.

    ``intermediate_size`` is the model's (full) expert width; the layer holds this rank's slice of it
    and its output is this rank's partial sum (the caller all-reduces across ranks).
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        params_dtype: torch.dtype,
        quant_method: str = "BF16",
        renormalize: bool = True,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.inter_range = moe_intermediate_partition(intermediate_size)
        self.intermediate_size = self.inter_range[1] - self.inter_range[0]
        self.params_dtype = params_dtype
        self.renormalize = renormalize
        self.prefix = prefix
        self.quant_method: FusedMoEMethodBase = get_moe_method(quant_method)
        self.quant_method.create_weights(self, num_experts, hidden_size, self.intermediate_size, params_dtype)

    @staticmethod
    def make_expert_params_mapping(
        num_experts: int,
        gate_proj_name: str = "gate_proj",
        down_proj_name: str = "down_proj",
        up_proj_name: str = "up_proj",
    ) -> list[tuple[str, str, int, str]]:
        """(param name prefix, checkpoint name fragment, expert id, shard id) for every expert weight,
        e.g. ("experts.w13_", "experts.3.gate_proj.", 3, "w1")."""
        names = {"gate_proj": gate_proj_name, "up_proj": up_proj_name, "down_proj": down_proj_name}
        return [
            (f"experts.{param}", f"experts.{expert}.{names[ckpt]}.", expert, shard)
            for expert in range(num_experts)
            for ckpt, shard, param in _CKPT_SHARDS
        ]

    def weight_loader(
        self,
        param_name_or_param: Union[str, torch.nn.Parameter],
        loaded_weight: torch.Tensor,
        shard_id: str,
        expert_id: int,
    ) -> None:
        """Load one checkpoint matrix (w1/w3: [I, H], w2: [H, I]); the method picks the target params.
        ``param_name_or_param`` "weight_scale_inv" (or an e4m3 ``loaded_weight``): a native FP8 checkpoint's
        block scale (or codes), held as they are by a format with that layout (FP8)."""
        load_expert_from_checkpoint(
            self, self.quant_method, self.inter_range, expert_id, shard_id, loaded_weight, param_name_or_param
        )

    def takes_checkpoint_experts(self, quant: CheckpointQuantization) -> bool:
        """Whether the experts of a checkpoint quantized as `quant` declares are held as they are."""
        return self.quant_method.holds_checkpoint(quant)

    def forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        is_prefill: bool = False,
        num_real_tokens: Optional[torch.Tensor] = None,
        topk_output: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        shared: Optional[SharedMLPWeights] = None,
    ) -> torch.Tensor:
        """`is_prefill` and `num_real_tokens` only matter to the KT wrapper (same signature). `topk_output`
        (weights, ids): a routing the model computed itself (DeepSeek's grouped top-k), else softmax top-k
        of `router_logits`. `shared`: a dense shared MLP run as one token's last slots of `topk_output`
        (fused_experts_triton)."""
        if topk_output is not None:
            topk_weights, topk_ids = topk_output
        else:
            topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        return self.quant_method.apply(self, hidden_states, topk_weights, topk_ids, shared=shared)

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, top_k={self.top_k}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, quant={self.quant_method.name}"
        )
