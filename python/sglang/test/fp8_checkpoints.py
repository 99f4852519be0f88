"""Tiny native FP8 checkpoints for tests: a transformers-written bf16 model (dims multiples of 128) whose linear
weights are quantized to e4m3 as the real checkpoints are (block fp8: `weight_scale_inv` per 128x128 block,
DeepSeek-V3 / Qwen3-FP8; compressed-tensors float-quantized: `weight_scale` per channel or per tensor);
embeddings, norms, the router and lm_head stay in full precision. Each is written with its reference: the same
model holding the dequantized weights, full precision, no quantization_config.

    d = write_fp8_checkpoint(dense_bf16(tmp + "/bf16"), tmp + "/fp8", "block")   # + tmp/fp8-dequantized

Benchmarks write a large one straight from a config, random codes and scales, shard by shard (no bf16 model first):

    write_random_block_fp8_checkpoint(config_dict, out_dir, device="cuda")   # Qwen3-8B: ~8 GB in seconds
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = 448.0
# Random codes' standard deviation: three sigmas (192) stay well inside e4m3's range, so few codes saturate.
CODE_STD = 64.0
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
    return save_with_reference(out_dir, config, quantization_config(strategy), fp8, reference)


def save_with_reference(out_dir: str, config: dict, quant: dict, tensors: dict, reference: dict) -> str:
    """The quantized checkpoint in `out_dir` (config.json with `quant` as its quantization_config) and its
    reference in `out_dir`-dequantized (the same config, no quantization_config)."""
    for d, part, extra in (
        (out_dir, tensors, {"quantization_config": quant}),
        (out_dir + "-dequantized", reference, {}),
    ):
        os.makedirs(d, exist_ok=True)
        save_file(part, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({**config, **extra}, f)
    return out_dir


def _is_quantized(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in QUANTIZED


def _random_tensors(
    name: str, shape: tuple, dtype: torch.dtype, gen: torch.Generator, std: float
) -> dict[str, torch.Tensor]:
    """One checkpoint tensor (on the generator's device): a decoder linear as e4m3 codes with fp32 scales per
    128x128 block (each block's scale drawn in [0.5, 1.5) x std / CODE_STD, so weights ~ N(0, std) and no two
    blocks alike), a norm as ones, anything else N(0, std) in `dtype`."""
    device = gen.device
    if _is_quantized(name):
        rows, cols = shape
        codes = torch.randn(shape, generator=gen, device=device).mul_(CODE_STD).clamp_(-E4M3_MAX, E4M3_MAX)
        blocks = (-(-rows // 128), -(-cols // 128))
        scale = torch.rand(blocks, generator=gen, device=device).add_(0.5).mul_(std / CODE_STD)
        return {name: codes.to(torch.float8_e4m3fn), name[: -len("weight")] + "weight_scale_inv": scale}
    if len(shape) == 1 and "norm" in name:
        return {name: torch.ones(shape, dtype=dtype, device=device)}
    return {name: torch.randn(shape, generator=gen, device=device).mul_(std).to(dtype)}


def _tensor_bytes(name: str, shape: tuple, dtype: torch.dtype) -> int:
    numel = 1
    for n in shape:
        numel *= n
    return numel if _is_quantized(name) else numel * dtype.itemsize


def plan_shards(shapes: dict[str, tuple], dtype: torch.dtype, shard_bytes: int) -> list[list[str]]:
    """Checkpoint tensor names grouped into shards of at most `shard_bytes` each (a tensor larger than that gets
    a shard of its own), in the order given."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = _tensor_bytes(name, shape, dtype)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_random_block_fp8_checkpoint(
    config: dict,
    out_dir: str,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    std: float = 0.02,
    shard_bytes: int = 2 * 1024**3,
) -> str:
    """A native block-fp8 checkpoint of `config`'s shapes (config.json's dict) with random weights, as DeepSeek-V3
    and Qwen3-*-FP8 ship theirs: every decoder linear e4m3 with ``weight_scale_inv`` per 128x128 block, the rest
    (embeddings, norms, lm_head) in `dtype`; config.json with the block quantization_config, safetensors shards
    of at most `shard_bytes` and model.safetensors.index.json. Tensors are drawn on `device` (the GPU draws
    Qwen3-8B's ~8 GB in well under a second) one shard at a time, so memory holds one shard, not the model."""
    from transformers import AutoConfig

    from sglang.srt.model_loader.dummy_weights import checkpoint_shapes

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({**config, "quantization_config": quantization_config("block")}, f, indent=2)
    shapes = checkpoint_shapes(AutoConfig.from_pretrained(out_dir))
    shards = plan_shards(shapes, dtype, shard_bytes)
    gen = torch.Generator(device=device).manual_seed(seed)
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            for key, t in _random_tensors(name, shapes[name], dtype, gen, std).items():
                tensors[key] = t.cpu()
                weight_map[key] = file
                total += t.numel() * t.element_size()
        save_file(tensors, os.path.join(out_dir, file), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return out_dir


def dense_bf16(d: str, head_dim: int = 64) -> str:
    """A tiny Llama in bf16; ``head_dim`` 128: each head's output one 128-column group of o_proj's input (the
    attention kernels then hand a block-fp8 o_proj its input quantized)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
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


# `every_expert`: each token routed to every expert (top-k = the expert count, every group), for the greedy tests
# of native FP8 on the GPU. With top-k routing these tiny random models are chaotic under fp8: our kernels and the
# fake-quantized reference round a few activations to neighbouring e4m3 codes, a token whose expert scores nearly
# tie then picks another expert, and the residual stream moves by a third (measured on the H200, 2026-12-04, GLM in
# fp32: 15.8 of 45 after layer 1), while each MoE layer on the same input matched the reference within 0.2% with
# the same experts chosen. With every expert routed the output is continuous in the input; the scales and layouts
# are checked as strictly, and the routing itself is checked by the bf16 and CPU tests.
def deepseek_v3_full(d: str, every_expert: bool = False, **overrides) -> str:
    """A tiny DeepSeek-V3 (transformers-written, fp32) whose dimensions are multiples of 128 where DeepSeek-V3's
    are (hidden, q_lora, kv_lora, every MLP): MLA with q_lora_rank, grouped noaux_tc routing with a correction
    bias, a shared expert, one dense layer; kv_a_proj_with_mqa (kv_lora + rope = 160) and q_b_proj (2 x 96) are
    ragged, as the real model's 576 and 128 x 192 rows are. `every_expert`: see the comment above; `overrides`: other
    config values."""
    from sglang.test.tiny_deepseek import make_tiny_deepseek

    dims = dict(
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
        topk_group=2 if every_expert else 1,
        **({"num_experts_per_tok": 4} if every_expert else {}),
    )
    make_tiny_deepseek("v3", d, seed=3, **{**dims, **overrides})
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


# Activations rounded to e4m3 turn last-bit differences (sums in another order: a CPU's matmul kernels, our absorbed
# attention) into whole e4m3 steps, so a near-tie may flip: how far below the reference's top-1 logit a token may be.
FP8_TIE = 0.05


def assert_near_the_quantized_reference(reference: torch.nn.Module, prompts, outs, min_exact: float = 0.9) -> None:
    """Greedy outputs under fp8 activations against transformers' model computing the same quantization
    (``fake_quantized``), teacher-forced on our tokens: every token the reference's top-1 or within FP8_TIE of it,
    and at least ``min_exact`` of them exactly its top-1."""
    exact = total = 0
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + out.output_ids])).logits[0, len(prompt) - 1 : -1].float()
        for step, tok in enumerate(out.output_ids):
            gap = (logits[step].max() - logits[step, tok]).item()
            assert gap <= FP8_TIE, f"prompt of {len(prompt)}: step {step} is {gap:.4f} below transformers' top-1"
            exact += int(logits[step].argmax().item() == tok)
            total += 1
    assert exact >= min_exact * total, f"{exact} of {total} tokens are the reference's top-1"


def glm4_moe_full(d: str, every_expert: bool = False) -> str:
    """A tiny GLM-4.5 (transformers-written, fp32; tiny_moe_families' glm4_moe) whose merged parts are multiples of
    128 as the real ones are: q|k|v of 2 heads x 64 (partial rotary 0.5, qk-norm, q/k/v biases), one leading dense
    MLP of 256, routed experts and one shared expert of 128, grouped noaux_tc routing with a correction bias.
    `every_expert`: see the comment above deepseek_v3_full."""
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
        **({"num_experts_per_tok": 8, "topk_group": 4} if every_expert else {}),
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
