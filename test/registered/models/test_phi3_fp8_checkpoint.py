from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Native block-FP8 Phi-3 checkpoints: q|k|v and gate|up stored fused (qkv_proj, gate_up_proj), each fused tensor
# quantized whole with `weight_scale_inv` per 128x128 block over its fused rows. A tiny transformers-written Phi-3
# (partial rotary 0.75, parts multiples of 128): greedy tokens equal transformers' on the CPU (dequantized at load)
# and in the GPU's format run on the CPU (the fused codes and scales as they are, activations quantized per
# 128-column group, against transformers quantizing the same activations). A fused tensor whose parts would split a
# 128-row scale block is refused at start-up on the GPU, naming the config fields.

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import block_aligned_family, fake_quantized, write_fp8_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, load_hf_model, make_scheduler, run_scheduler

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def fp8_phi3(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3-fp8")
    d = write_fp8_checkpoint(block_aligned_family("phi3", str(root / "full")), str(root / "fp8"), "block")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (3, 19)]
    return d, prompts, load_file(f"{d}/model.safetensors")


def _scheduler(d: str):
    return make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)


def test_cpu_dequantizes_the_fused_projections(fp8_phi3):
    d, prompts, ckpt = fp8_phi3
    assert ckpt["model.layers.0.self_attn.qkv_proj.weight_scale_inv"].shape == (3, 1)  # q, k, v: one block each
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    sched = _scheduler(d)
    assert all(p.dtype == torch.float32 for p in sched.model_runner.model.parameters())
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_gpu_format_keeps_the_fused_checkpoints_fp8(fp8_phi3, monkeypatch):
    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers.linear import LinearBase

    d, prompts, ckpt = fp8_phi3
    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = _scheduler(d)
    model = sched.model_runner.model
    assert all(m.is_block_fp8 for m in model.modules() if isinstance(m, LinearBase))
    layer = model.model.layers[1]
    for ours, name in ((layer.self_attn.qkv_proj, "self_attn.qkv_proj"), (layer.mlp.gate_up_proj, "mlp.gate_up_proj")):
        fused = ckpt[f"model.layers.1.{name}.weight"]
        assert torch.equal(ours.weight.view(torch.uint8), fused.view(torch.uint8)), name
        assert torch.equal(ours.weight_scale_inv, ckpt[f"model.layers.1.{name}.weight_scale_inv"]), name
    ref = hf_greedy(fake_quantized(load_hf_model(d + "-dequantized"), "block"), prompts, NEW_TOKENS)
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_fused_parts_off_the_scale_blocks_are_refused_on_the_gpu():
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.test.fp8_checkpoints import quantization_config
    from sglang.test.tiny_moe_families import tiny_family_config

    # Phi-3-mini's 96-wide heads, 3 of them: k would start at row 288, inside q|k's third scale block.
    config = tiny_family_config(
        "phi3", hidden_size=288, num_attention_heads=3, num_key_value_heads=3, intermediate_size=256,
        architectures=["Phi3ForCausalLM"], quantization_config=quantization_config("block"),
    )  # fmt: skip
    with pytest.raises(ValueError, match="num_attention_heads x head_dim = 288"):
        ModelConfig.from_hf_config(config, dtype="bfloat16", device="cuda")
    assert ModelConfig.from_hf_config(config, device="cpu").quantization is None  # the CPU dequantizes and runs it
