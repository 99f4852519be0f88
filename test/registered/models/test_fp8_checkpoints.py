from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Native FP8 checkpoints on the CPU: tiny models written by transformers (dims multiples of 128), their linear
# weights quantized here to e4m3 the way the real checkpoints are (block fp8: `weight_scale_inv` per 128x128
# block, DeepSeek-V3 / Qwen3-FP8; compressed-tensors float-quantized: `weight_scale` per channel or per
# tensor), embeddings, norms, router and lm_head left in full precision. The engine dequantizes at load;
# greedy tokens equal transformers' on the dequantized weights, dense and MoE (Qwen3-MoE experts too).

import random

import pytest
import torch

from sglang.test.fp8_checkpoints import (
    assert_near_the_quantized_reference,
    dense_bf16,
    fake_quantized,
    moe_bf16,
    write_fp8_checkpoint,
)
from sglang.test.runners import greedy_params, hf_greedy, load_hf_model, make_scheduler, run_scheduler

NEW_TOKENS = 16


def prompts(vocab: int):
    rng = random.Random(11)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (2, 9, 31)]


@pytest.mark.parametrize(
    "arch,strategy", [("dense", "block"), ("dense", "channel"), ("dense", "tensor"), ("moe", "block")]
)
def test_fp8_checkpoint_equals_transformers_on_dequantized_weights(arch, strategy, tmp_path):
    bf16 = (dense_bf16 if arch == "dense" else moe_bf16)(str(tmp_path / "bf16"))
    d = write_fp8_checkpoint(bf16, str(tmp_path / f"fp8-{strategy}"), strategy)
    vocab = 512 if arch == "dense" else 256
    reference_model = load_hf_model(d + "-dequantized")
    ref = hf_greedy(reference_model, prompts(vocab), NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate

    sched = make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)
    model = sched.model_runner.model
    # The CPU holds the dequantized weights, exactly: compare one attention and one expert projection.
    hf = dict(reference_model.named_parameters())
    ours = dict(model.named_parameters())
    q_rows = hf["model.layers.1.self_attn.q_proj.weight"].shape[0]
    assert torch.equal(
        ours["model.layers.1.self_attn.qkv_proj.weight"][:q_rows], hf["model.layers.1.self_attn.q_proj.weight"]
    )
    assert all(p.dtype == torch.float32 for p in ours.values())
    outs = run_scheduler(sched, prompts(vocab), greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


@pytest.mark.parametrize("strategy", ["block", "channel"])
def test_layers_keeping_the_checkpoints_fp8(strategy, tmp_path, monkeypatch):
    """The GPU's format (the linear layers keep the checkpoint's fp8 weights and scales, activations quantized at
    every call), run here on the CPU: the weights are the checkpoint's bytes, and greedy tokens are transformers'
    with the same quantization of weights and activations, near-ties aside (fp8 activations turn a CPU's summation
    order into whole e4m3 steps: [channel] flipped a near-tie on a Xeon development machine, 2026-12-05)."""
    from safetensors.torch import load_file

    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers.linear import LinearBase

    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: f"fp8_{strategy}")  # as on the GPU
    d = write_fp8_checkpoint(dense_bf16(str(tmp_path / "bf16")), str(tmp_path / "fp8"), strategy)
    sched = make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)
    model = sched.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert len(linears) == 8 and all(m.weight.dtype == torch.float8_e4m3fn for m in linears)
    ckpt = load_file(f"{d}/model.safetensors")
    attn = model.model.layers[1].self_attn
    parts = [f"model.layers.1.self_attn.{p}_proj." for p in "qkv"]
    assert torch.equal(
        attn.qkv_proj.weight.view(torch.uint8), torch.cat([ckpt[p + "weight"] for p in parts]).view(torch.uint8)
    )
    if strategy == "block":
        assert torch.equal(attn.qkv_proj.weight_scale_inv, torch.cat([ckpt[p + "weight_scale_inv"] for p in parts]))
    else:
        assert torch.equal(attn.qkv_proj.weight_scale, torch.cat([ckpt[p + "weight_scale"] for p in parts]))

    reference = fake_quantized(load_hf_model(d + "-dequantized"), strategy)
    outs = run_scheduler(sched, prompts(512), greedy_params(NEW_TOKENS))
    assert_near_the_quantized_reference(reference, prompts(512), outs)


def test_dummy_weights_in_the_checkpoints_format(tmp_path, monkeypatch):
    """--load-format dummy on an FP8 config (large shapes on the GPU): random weights quantized into the
    layers' fp8 format with scales, so every parameter is filled and the model runs."""
    import sglang.srt.configs.model_config as model_config

    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")
    d = write_fp8_checkpoint(dense_bf16(str(tmp_path / "bf16")), str(tmp_path / "fp8"), "block")
    sched = make_scheduler(
        reuse_model=False, model_path=d, load_format="dummy", skip_tokenizer_init=True, max_total_tokens=1024
    )
    scale = sched.model_runner.model.model.layers[0].mlp.down_proj.weight_scale_inv
    assert scale.shape == (2, 3) and bool((scale != 1).all())  # filled from the random weights, not left at 1
    out = run_scheduler(sched, prompts(512)[:1], greedy_params(4))[0]
    assert len(out.output_ids) == 4


@pytest.mark.parametrize("strategy", ["block", "channel"])
def test_moe_experts_keep_the_checkpoints_fp8(strategy, tmp_path, monkeypatch):
    """The GPU's format for an fp8 Qwen3-MoE, run on the CPU: the experts hold the checkpoint's e4m3 codes and
    scales as they are (the fused MoE's FP8 layout for 128x128 blocks, FP8_PERCHANNEL for a scale per row;
    weight-only), the attention projections the fp8 linear format; greedy tokens equal transformers' with the same
    quantization."""
    from safetensors.torch import load_file

    import sglang.srt.configs.model_config as model_config

    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: f"fp8_{strategy}")  # as on the GPU
    d = write_fp8_checkpoint(moe_bf16(str(tmp_path / "bf16")), str(tmp_path / "fp8"), strategy)
    sched = make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)
    experts = sched.model_runner.model.model.layers[1].mlp.experts
    method = {"block": "FP8", "channel": "FP8_PERCHANNEL"}[strategy]
    assert experts.quant_method.name == method and experts.w13_weight.dtype == torch.float8_e4m3fn
    ckpt = load_file(f"{d}/model.safetensors")
    e = "model.layers.1.mlp.experts.2."
    gate_up = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(experts.w13_weight[2].view(torch.uint8), gate_up.view(torch.uint8))
    if strategy == "block":
        assert torch.equal(experts.w2_weight_scale_inv[2], ckpt[e + "down_proj.weight_scale_inv"])
    else:
        assert torch.equal(experts.w2_weight_scale[2], ckpt[e + "down_proj.weight_scale"].reshape(-1))

    # Experts weight-only (the dequantized weights), the router in full precision: only attention fake-quantized.
    ref_model = fake_quantized(load_hf_model(d + "-dequantized"), strategy, attention_only=True)
    ref = hf_greedy(ref_model, prompts(256), NEW_TOKENS)
    outs = run_scheduler(sched, prompts(256), greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


def test_random_block_fp8_checkpoint_is_served_as_written(tmp_path, monkeypatch):
    """write_random_block_fp8_checkpoint (the serving benchmark's Qwen3-8B-shaped checkpoint, tiny here): shards
    and index name every tensor of the config's model once, each decoder linear as e4m3 codes with a 128x128
    block scale; the engine, in the GPU's format, holds those bytes, and its greedy tokens equal transformers'
    on the dequantized weights with the same activation quantization."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    import sglang.srt.configs.model_config as model_config
    from sglang.srt.model_loader.dummy_weights import checkpoint_shapes
    from sglang.test.fp8_checkpoints import dequantize, write_random_block_fp8_checkpoint

    config = dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        vocab_size=512,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    d = write_random_block_fp8_checkpoint(config, str(tmp_path / "fp8"), std=0.08, shard_bytes=400_000)
    with open(f"{d}/model.safetensors.index.json") as f:
        weight_map = json.load(f)["weight_map"]
    assert len(set(weight_map.values())) > 2  # written shard by shard
    tensors = {}
    for file in set(weight_map.values()):
        part = load_file(f"{d}/{file}")
        assert all(weight_map[name] == file for name in part)
        tensors.update(part)
    assert set(tensors) == set(weight_map)
    shapes = checkpoint_shapes(AutoConfig.from_pretrained(d))
    quantized = [n for n in shapes if n.endswith("_proj.weight")]
    assert len(quantized) == 2 * 7
    assert set(tensors) == set(shapes) | {n + "_scale_inv" for n in quantized}
    for name in quantized:
        q, scale = tensors[name], tensors[name + "_scale_inv"]
        assert q.dtype == torch.float8_e4m3fn and q.float().isfinite().all()
        assert scale.shape == (-(-q.shape[0] // 128), -(-q.shape[1] // 128)) and len(scale.unique()) == scale.numel()
    assert tensors["model.norm.weight"].dtype == torch.bfloat16

    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)
    down = sched.model_runner.model.model.layers[1].mlp.down_proj
    assert torch.equal(down.weight.view(torch.uint8), tensors["model.layers.1.mlp.down_proj.weight"].view(torch.uint8))
    assert torch.equal(down.weight_scale_inv, tensors["model.layers.1.mlp.down_proj.weight_scale_inv"])

    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.float32)
    state = {
        n: dequantize(t, tensors[n + "_scale_inv"], "block") if n in quantized else t.float()
        for n, t in tensors.items()
        if not n.endswith("_scale_inv")
    }
    reference.load_state_dict(state)
    ref = hf_greedy(fake_quantized(reference.eval(), "block"), prompts(512), NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    outs = run_scheduler(sched, prompts(512), greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
