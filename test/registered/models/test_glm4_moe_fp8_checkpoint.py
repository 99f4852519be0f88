from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Native block-FP8 GLM-4.5 checkpoints (the format of GLM-4.5/4.6/4.7-FP8): a tiny GLM-4.5 written by transformers
# (merged parts multiples of 128, partial rotary, qk-norm, q/k/v biases, one leading dense layer, a shared expert,
# grouped noaux_tc routing), every decoder linear quantized to e4m3 with `weight_scale_inv` per 128x128 block,
# quantization_config fp8 [128, 128]; router, correction bias, biases, norms, embeddings, lm_head in full precision.
# Greedy tokens equal transformers' on the dequantized weights:
# - on the CPU (every weight dequantized at load), and with --kt-method FP8 (the CPU kernels and the GPU-side experts
#   hold the checkpoint's own codes and scales); a per-channel (compressed-tensors) GLM under --kt-method
#   FP8_PERCHANNEL likewise;
# - in the GPU's format run on the CPU (fp8 q|k|v, o_proj, dense and shared MLPs with activations quantized per
#   128-column group; FP8 routed experts, weight-only), against transformers quantizing the same activations.

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import fake_quantized, glm4_moe_full, write_fp8_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, load_hf_model, make_scheduler, run_scheduler

NEW_TOKENS = 10
L1 = "model.layers.1."


@pytest.fixture(scope="module")
def fp8_glm(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm4-moe-fp8")
    d = write_fp8_checkpoint(glm4_moe_full(str(root / "full")), str(root / "fp8"), "block")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (2, 9, 23)]
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    return d, prompts, ref, load_file(f"{d}/model.safetensors")


def _scheduler(d: str, **kw):
    return make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, **kw)


def test_cpu_dequantizes_every_weight(fp8_glm):
    d, prompts, ref, ckpt = fp8_glm
    sched = _scheduler(d)
    model = sched.model_runner.model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    experts = model.model.layers[2].mlp.experts
    assert (
        experts.quant_method.name == "BF16"
        and ckpt["model.layers.2.mlp.experts.0.up_proj.weight"].dtype == torch.float8_e4m3fn
    )
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_kt_fp8_experts_from_the_checkpoint_and_the_rest_dequantized(fp8_glm):
    """The CPU's format (every linear dequantized at load) with --kt-method FP8: the CPU kernels' experts and the
    GPU-side one hold the checkpoint's codes and scales as they are (no BF16 round trip)."""
    d, prompts, ref, ckpt = fp8_glm
    sched = _scheduler(d, kt_method="FP8", kt_num_gpu_experts=1)
    model = sched.model_runner.model
    attn, wrapper = model.model.layers[1].self_attn, model.model.layers[1].mlp.experts
    assert attn.qkv_proj.weight.dtype == torch.float32 and attn.qkv_proj.bias is not None
    cpu, idx = wrapper.expert_home(5)
    assert cpu is wrapper.cpu_layer and cpu.w13_weight.dtype == torch.float8_e4m3fn
    e = L1 + "mlp.experts.5."
    gate_up = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(cpu.w13_weight[idx].view(torch.uint8), gate_up.view(torch.uint8))
    assert torch.equal(cpu.w2_weight_scale_inv[idx], ckpt[e + "down_proj.weight_scale_inv"])
    gpu0 = ckpt[L1 + "mlp.experts.0.down_proj.weight"]
    assert torch.equal(wrapper.gpu_experts.w2_weight[0].view(torch.uint8), gpu0.view(torch.uint8))
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
    assert model.kt_state.cpu_engine.stats().pairs > 0


def test_gpu_format_keeps_the_checkpoints_fp8(fp8_glm, monkeypatch):
    """What the GPU builds (linear_weight_format "fp8_block"), run on the CPU: q|k|v (its biases in full precision),
    o_proj, the dense MLP and the shared expert hold the checkpoint's e4m3 codes and block scales, the routed
    experts the FP8 fused-MoE layout; greedy tokens equal transformers' with the same quantization."""
    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers.linear import LinearBase

    d, prompts, _, ckpt = fp8_glm
    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = _scheduler(d)
    model = sched.model_runner.model
    assert sched.model_runner.model_config.quantization == "fp8_block"
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    qkv = [L1 + f"self_attn.{p}_proj." for p in "qkv"]
    assert torch.equal(
        attn.qkv_proj.weight.view(torch.uint8), torch.cat([ckpt[p + "weight"] for p in qkv]).view(torch.uint8)
    )
    assert torch.equal(attn.qkv_proj.weight_scale_inv, torch.cat([ckpt[p + "weight_scale_inv"] for p in qkv]))
    assert torch.equal(attn.qkv_proj.bias, torch.cat([ckpt[p + "bias"] for p in qkv]))
    dense = "model.layers.0.mlp."
    for layer, name in (
        (attn.o_proj, L1 + "self_attn.o_proj"),
        (mlp.shared_experts.down_proj, L1 + "mlp.shared_experts.down_proj"),
        (model.model.layers[0].mlp.down_proj, dense + "down_proj"),
    ):
        assert torch.equal(layer.weight.view(torch.uint8), ckpt[name + ".weight"].view(torch.uint8)), name
        assert torch.equal(layer.weight_scale_inv, ckpt[name + ".weight_scale_inv"]), name
    gate_up = model.model.layers[0].mlp.gate_up_proj
    assert torch.equal(
        gate_up.weight_scale_inv, torch.cat([ckpt[dense + "gate_proj.weight_scale_inv"], ckpt[dense + "up_proj.weight_scale_inv"]])
    )  # fmt: skip
    assert all(m.is_block_fp8 for m in model.modules() if isinstance(m, LinearBase))
    assert mlp.experts.quant_method.name == "FP8"
    e = L1 + "mlp.experts.6."
    gate_up6 = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(mlp.experts.w13_weight[6].view(torch.uint8), gate_up6.view(torch.uint8))
    assert torch.equal(mlp.experts.w2_weight_scale_inv[6], ckpt[e + "down_proj.weight_scale_inv"])

    # transformers' routed experts are no nn.Linear (weight-only, as ours), its router is fp32 (as ours).
    reference = fake_quantized(load_hf_model(d + "-dequantized"), "block")
    ref = hf_greedy(reference, prompts, NEW_TOKENS)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


def test_kt_fp8_perchannel_on_a_per_channel_glm(tmp_path):
    """A compressed-tensors GLM-4.5 (`weight_scale` per output row, as llm-compressor's FP8 recipe writes a GLM)
    under --kt-method FP8_PERCHANNEL: the CPU kernels' experts and the GPU-side one hold its codes and row scales as
    they are, the shared expert and attention are dequantized (the CPU's format); greedy tokens equal transformers'
    on the dequantized weights."""
    d = write_fp8_checkpoint(glm4_moe_full(str(tmp_path / "full")), str(tmp_path / "fp8"), "channel")
    ckpt = load_file(f"{d}/model.safetensors")
    rng = random.Random(6)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (3, 14)]
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    sched = _scheduler(d, kt_method="FP8_PERCHANNEL", kt_num_gpu_experts=1)
    model = sched.model_runner.model
    wrapper = model.model.layers[1].mlp.experts
    cpu, idx = wrapper.expert_home(4)
    assert cpu is wrapper.cpu_layer and cpu.quant_method.name == "FP8_PERCHANNEL"
    e = L1 + "mlp.experts.4."
    assert torch.equal(cpu.w2_weight[idx].view(torch.uint8), ckpt[e + "down_proj.weight"].view(torch.uint8))
    assert torch.equal(cpu.w13_weight_scale[idx], torch.cat([ckpt[e + p + ".weight_scale"] for p in ("gate_proj", "up_proj")]).reshape(-1))  # fmt: skip
    assert model.model.layers[1].mlp.shared_experts.down_proj.weight.dtype == torch.float32
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
    assert model.kt_state.cpu_engine.stats().pairs > 0


def test_block_fp8_widths_name_glms_merged_parts():
    """On the GPU every merged part must be block-aligned, the shared and routed experts' too; a leading dense MLP
    that is not (GLM-4.5-Air's 10944) keeps full precision instead of refusing the model."""
    from sglang.srt.configs.model_config import block_fp8_merged_widths
    from sglang.srt.configs.quantization_config import block_aligned_format, check_block_fp8_layout
    from sglang.test.tiny_moe_families import tiny_family_config

    air = tiny_family_config("glm4_moe", head_dim=128, intermediate_size=10944, moe_intermediate_size=1408)
    widths = block_fp8_merged_widths(air, 128, 2, "Glm4MoeForCausalLM")
    assert widths["moe_intermediate_size"] == 1408 and widths["n_shared_experts x moe_intermediate_size"] == 1408
    check_block_fp8_layout(widths)  # the dense MLP's 10944 is not among them
    assert block_aligned_format("fp8_block", 10944) is None and block_aligned_format("fp8_block", 12288) == "fp8_block"
    ragged = tiny_family_config("glm4_moe", head_dim=128, moe_intermediate_size=1400)
    with pytest.raises(ValueError, match="moe_intermediate_size = 1400"):
        check_block_fp8_layout(block_fp8_merged_widths(ragged, 128, 2, "Glm4MoeForCausalLM"))
