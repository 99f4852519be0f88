"""Tiny native FP8 checkpoints for tests: a transformers-written bf16 model (dims multiples of 128) whose linear
weights are quantized to e4m3 as the real checkpoints are (block fp8: `weight_scale_inv` per 128x128 block,
DeepSeek-V3 / Qwen3-FP8; compressed-tensors float-quantized: `weight_scale` per channel or per tensor);
embeddings, norms, the router and lm_head stay in full precision. Each is written with its reference: the same
model holding the dequantized weights, full precision, no quantization_config.

    d = write_fp8_checkpoint(dense_bf16(tmp + "/bf16"), tmp + "/fp8", "block")   # + tmp/fp8-dequantized
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = 448.0
# Every decoder linear of the families here, DeepSeek's MLA projections (kv_b_proj too, as DeepSeek-V3 ships it).
QUANTIZED = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
    "qkv_proj",  # Phi-3's fused q|k|v and gate|up, quantized whole (128-row blocks over the fused rows)
    "gate_up_proj",
    "w1",  # Mixtral's experts: gate, down, up
    "w2",
    "w3",
)


def quantize(w: torch.Tensor, strategy: str):
    """e4m3 codes and the fp32 scale with w ~= codes x scale (per 128x128 block, ceil-sized, per row, or per
    tensor). A ragged edge (SmolLM2's 576, DeepSeek-V3's kv_a_proj_with_mqa rows) gets a partial block, as the real
    checkpoints."""
    w = w.float()
    if strategy == "block":  # dims that are not multiples of 128 end in partial blocks (SmolLM2's 576)
        from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod

        return Fp8FusedMoEMethod().quantize(w)
    scale = (w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax().reshape(1)) / E4M3_MAX
    return (w / scale).to(torch.float8_e4m3fn), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, strategy: str) -> torch.Tensor:
    if strategy == "block":
        from sglang.srt.layers.quantization.fp8_block_linear import dequantize_blocks

        return dequantize_blocks(q, scale)
    return q.float() * scale


def quantization_config(strategy: str) -> dict:
    if strategy == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }


def write_fp8_checkpoint(bf16_dir: str, out_dir: str, strategy: str) -> str:
    """The bf16 checkpoint in `bf16_dir` as an FP8 one in `out_dir`; `out_dir`-dequantized holds the reference
    (the same model with every weight replaced by its dequantized value, full precision, no quantization)."""
    state = load_file(os.path.join(bf16_dir, "model.safetensors"))
    with open(os.path.join(bf16_dir, "config.json")) as f:
        config = json.load(f)
    fp8, reference = {}, {}
    scale_name = "weight_scale_inv" if strategy == "block" else "weight_scale"
    for name, t in state.items():
        if name.endswith(".weight") and name.split(".")[-2] in QUANTIZED:
            q, scale = quantize(t, strategy)
            fp8[name], fp8[name[: -len("weight")] + scale_name] = q, scale
            reference[name] = dequantize(q, scale, strategy)
        else:
            fp8[name], reference[name] = t, t.float()
    for d, tensors, extra in (
        (out_dir, fp8, {"quantization_config": quantization_config(strategy)}),
        (out_dir + "-dequantized", reference, {}),
    ):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({**config, **extra}, f)
    return out_dir


def dense_bf16(d: str) -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=512,
        max_position_embeddings=256,
        initializer_range=0.08,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(d)
    return d


def moe_bf16(d: str) -> str:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        vocab_size=256,
        max_position_embeddings=256,
        initializer_range=0.08,
        architectures=["Qwen3MoeForCausalLM"],
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(d)
    return d


def deepseek_v3_full(d: str) -> str:
    """A tiny DeepSeek-V3 (transformers-written, fp32) whose dimensions are multiples of 128 where DeepSeek-V3's
    are (hidden, q_lora, kv_lora, every MLP): MLA with q_lora_rank, grouped noaux_tc routing with a correction
    bias, a shared expert, one dense layer; kv_a_proj_with_mqa (kv_lora + rope = 160) and q_b_proj (2 x 96) are
    ragged, as the real model's 576 and 128 x 192 rows are."""
    from sglang.test.tiny_deepseek import make_tiny_deepseek

    make_tiny_deepseek(
        "v3",
        d,
        seed=3,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=128,
        q_lora_rank=128,
        kv_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        n_group=2,
        topk_group=1,
    )
    return d


class FakeQuantLinear(torch.nn.Module):
    """transformers' Linear computing as our fp8 layer does: the checkpoint's dequantized weight, the input
    rounded through e4m3 per token and 128-column group (block) or per token (channel / tensor). With
    `activation_dtype`, the input is first rounded to that dtype: our GPU layers quantize bf16 activations, and
    rounding an fp32 value straight to e4m3 gives another code than rounding it through bf16 first for about
    one element in sixteen."""

    def __init__(self, linear: torch.nn.Linear, strategy: str, activation_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight, self.bias, self.strategy = linear.weight, linear.bias, strategy
        self.activation_dtype = activation_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from sglang.srt.layers.quantization.fp8_block_linear import quantize_groups_reference
        from sglang.srt.layers.quantization.fp8_linear import quantize_rows

        x2 = x.reshape(-1, x.shape[-1])
        if self.activation_dtype is not None:
            x2 = x2.to(self.activation_dtype)
        if self.strategy == "block":
            q, s = quantize_groups_reference(x2)
            xq = q.float() * s.repeat_interleave(128, 1)[:, : x2.shape[1]]
        else:
            q, s = quantize_rows(x2)
            xq = q.float() * s
        return torch.nn.functional.linear(xq.view(x.shape), self.weight, self.bias)


def fake_quantized(
    model: torch.nn.Module,
    strategy: str,
    attention_only: bool = False,
    activation_dtype: torch.dtype | None = None,
    weight_only: tuple = (),
) -> torch.nn.Module:
    """transformers' model (holding the dequantized weights) with its decoder Linears, nested ones too (DeepSeek's
    shared_experts), computing as our fp8 layers do (FakeQuantLinear); `attention_only` for Qwen3-MoE, whose MLPs
    are all weight-only fp8 experts; `weight_only`: Linear names left as they are (DeepSeek's kv_b_proj, absorbed
    in full precision). Routed experts and DeepSeek's router are no nn.Linear: weight-only."""
    for layer in model.model.layers:
        for parent in (layer.self_attn,) if attention_only else (layer.self_attn, layer.mlp):
            for path, child in list(parent.named_modules()):
                if isinstance(child, torch.nn.Linear) and path.split(".")[-1] not in weight_only:
                    owner, _, name = path.rpartition(".")
                    setattr(parent.get_submodule(owner), name, FakeQuantLinear(child, strategy, activation_dtype))
    return model


def glm4_moe_full(d: str) -> str:
    """A tiny GLM-4.5 (transformers-written, fp32; tiny_moe_families' glm4_moe) whose merged parts are multiples of
    128 as the real ones are: q|k|v of 2 heads x 64 (partial rotary 0.5, qk-norm, q/k/v biases), one leading dense
    MLP of 256, routed experts and one shared expert of 128, grouped noaux_tc routing with a correction bias."""
    from sglang.test.tiny_moe_families import make_tiny_family

    make_tiny_family(
        "glm4_moe",
        d,
        seed=1,
        init_std=0.15,
        hidden_size=128,
        head_dim=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=256,
        moe_intermediate_size=128,
    )
    return d


# tiny_moe_families' checkpoints with every merged part a multiple of 128 (q|k|v of 2 heads x 64, gate|up of the
# experts, the shared expert and the dense layers), each keeping what its family has that others do not.
BLOCK_ALIGNED_FAMILIES = {
    "qwen2_moe": dict(  # q/k/v biases, a shared expert and its sigmoid gate, layer 1 dense (mlp_only_layers)
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=256,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
    ),
    "olmoe": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=128),  # q/k norms
    "mixtral": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=128),  # w1/w2/w3
    # fused qkv_proj / gate_up_proj in the checkpoint, partial rotary 0.75
    "phi3": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=256),
}


def block_aligned_family(family: str, d: str) -> str:
    """A tiny transformers-written `family` checkpoint (fp32) in `d`, shaped for block-fp8 (BLOCK_ALIGNED_FAMILIES)."""
    from sglang.test.tiny_moe_families import make_tiny_family

    make_tiny_family(family, d, seed=2, init_std=0.15, **BLOCK_ALIGNED_FAMILIES[family])
    return d
