from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Native block-FP8 DeepSeek-V3 checkpoints (the format DeepSeek-V3/R1 and Kimi-K2 ship): a tiny DeepSeek-V3 written
# by transformers (dims multiples of 128, MLA with q_lora_rank, grouped routing, a shared expert, one dense layer),
# every decoder linear quantized to e4m3 with `weight_scale_inv` per 128x128 block (ragged edges as the real
# kv_a_proj_with_mqa's 576 rows), quantization_config fp8 [128, 128]; router, norms, embeddings, lm_head in full
# precision. Greedy tokens equal transformers' on the dequantized weights:
# - on the CPU (every weight dequantized at load);
# - with --kt-method FP8 (the CPU kernels and the GPU-side experts hold the checkpoint's own codes and scales);
# - in the GPU's format run on the CPU (fp8 projections and MLPs with activations quantized per 128-column group,
#   FP8 routed experts, kv_b_proj dequantized for the absorbed attention).
# A multi-token-prediction layer (fp8 too) follows the last layer, as in the published checkpoints: skipped at load.

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import (
    assert_near_the_quantized_reference,
    deepseek_v3_full,
    fake_quantized,
    write_fp8_checkpoint,
)
from sglang.test.runners import greedy_params, hf_greedy, load_hf_model, make_scheduler, run_scheduler

NEW_TOKENS = 12
L1 = "model.layers.1."


def _append_mtp_layer(d: str) -> None:
    """As DeepSeek-V3/R1 ship: one multi-token-prediction layer after the last (index num_hidden_layers), fp8 like
    the others (here a copy of layer 1's tensors), num_nextn_predict_layers 1. The engine drops it at load."""
    import json

    from safetensors.torch import save_file

    tensors = load_file(f"{d}/model.safetensors")
    with open(f"{d}/config.json") as f:
        config = json.load(f)
    mtp = f"model.layers.{config['num_hidden_layers']}."
    tensors.update({k.replace(L1, mtp): v.clone() for k, v in tensors.items() if k.startswith(L1)})
    save_file(tensors, f"{d}/model.safetensors")
    with open(f"{d}/config.json", "w") as f:
        json.dump({**config, "num_nextn_predict_layers": 1}, f)


@pytest.fixture(scope="module")
def fp8_v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek-fp8")
    d = write_fp8_checkpoint(deepseek_v3_full(str(root / "full")), str(root / "fp8"), "block")
    _append_mtp_layer(d)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (2, 9, 31)]
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    return d, prompts, ref, load_file(f"{d}/model.safetensors"), load_file(f"{d}-dequantized/model.safetensors")


def _scheduler(d: str, **kw):
    return make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, **kw)


def test_cpu_dequantizes_every_projection(fp8_v3):
    d, prompts, ref, ckpt, dequantized = fp8_v3
    assert ckpt[L1 + "self_attn.kv_a_proj_with_mqa.weight"].dtype == torch.float8_e4m3fn
    assert ckpt[L1 + "self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape == (2, 1)  # 160 rows: a ragged block
    assert "model.layers.3.mlp.experts.0.up_proj.weight_scale_inv" in ckpt  # the MTP layer, dropped at load
    sched = _scheduler(d)
    model = sched.model_runner.model
    ours = dict(model.named_parameters())
    for name in ("self_attn.kv_b_proj", "self_attn.q_b_proj", "mlp.shared_experts.down_proj"):
        assert torch.equal(ours[L1 + name + ".weight"], dequantized[L1 + name + ".weight"]), name
    # q_a_proj and kv_a_proj_with_mqa: one layer's rows, back to back
    fused = torch.cat([dequantized[L1 + f"self_attn.{n}.weight"] for n in ("q_a_proj", "kv_a_proj_with_mqa")])
    assert torch.equal(ours[L1 + "self_attn.fused_qkv_a_proj_with_mqa.weight"], fused)
    experts = model.model.layers[1].mlp.experts
    assert torch.equal(experts.w2_weight[3], dequantized[L1 + "mlp.experts.3.down_proj.weight"])
    assert all(p.dtype == torch.float32 for p in ours.values())
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


def test_kt_fp8_feeds_the_checkpoints_experts_to_the_cpu_kernels(fp8_v3):
    d, prompts, ref, ckpt, _ = fp8_v3
    sched = _scheduler(d, kt_method="FP8", kt_num_gpu_experts=1)
    wrapper = sched.model_runner.model.model.layers[1].mlp.experts
    cpu, idx = wrapper.expert_home(2)
    assert cpu is wrapper.cpu_layer and cpu.w13_weight.dtype == torch.float8_e4m3fn
    e = L1 + "mlp.experts.2."
    gate_up = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(cpu.w13_weight[idx].view(torch.uint8), gate_up.view(torch.uint8))  # no BF16 round trip
    assert torch.equal(cpu.w2_weight_scale_inv[idx], ckpt[e + "down_proj.weight_scale_inv"])
    gpu0 = ckpt[L1 + "mlp.experts.0.down_proj.weight"]
    assert torch.equal(wrapper.gpu_experts.w2_weight[0].view(torch.uint8), gpu0.view(torch.uint8))
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
    assert sched.model_runner.model.kt_state.cpu_engine.stats().pairs > 0


def test_gpu_format_keeps_the_checkpoints_fp8(fp8_v3, monkeypatch):
    """What the GPU builds (linear_weight_format "fp8_block"), run on the CPU: the projections, dense and shared
    MLPs hold the checkpoint's e4m3 codes and block scales, the routed experts the FP8 fused-MoE layout, kv_b_proj
    its dequantized weight (absorbed into the query and the latent context, never run as a layer)."""
    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers.linear import LinearBase

    d, prompts, _, ckpt, dequantized = fp8_v3
    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = _scheduler(d)
    model = sched.model_runner.model
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp

    def stacked(*names: str, suffix: str) -> torch.Tensor:  # the checkpoint tensors back to back (fp8 as bytes)
        parts = [ckpt[L1 + name + suffix] for name in names]
        return torch.cat([p.view(torch.uint8) if p.dtype == torch.float8_e4m3fn else p for p in parts])

    for layer, names in ((attn.fused_qkv_a_proj_with_mqa, ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")),
                         (attn.o_proj, ("self_attn.o_proj",)),
                         (mlp.shared_experts.down_proj, ("mlp.shared_experts.down_proj",))):  # fmt: skip
        assert layer.is_block_fp8, names
        weight, scales = stacked(*names, suffix=".weight"), stacked(*names, suffix=".weight_scale_inv")
        # the stacked layer: q_a's 128 rows (one scale block), kv_a's 160 after them, padded to 384 (whole blocks)
        assert layer.weight.shape[0] == -(-weight.shape[0] // 128) * 128, names
        assert torch.equal(layer.weight.view(torch.uint8)[: weight.shape[0]], weight), names
        assert torch.equal(layer.weight_scale_inv[: scales.shape[0]], scales), names
    assert model.model.layers[0].mlp.gate_up_proj.is_block_fp8  # the dense layer
    assert attn.kv_b_proj.weight.dtype == torch.float32 and not attn.kv_b_proj.is_block_fp8
    assert torch.equal(attn.kv_b_proj.weight, dequantized[L1 + "self_attn.kv_b_proj.weight"])
    assert mlp.experts.quant_method.name == "FP8"
    e = L1 + "mlp.experts.1."
    assert torch.equal(mlp.experts.w2_weight[1].view(torch.uint8), ckpt[e + "down_proj.weight"].view(torch.uint8))
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert sum(not m.is_block_fp8 for m in linears) == 3  # kv_b_proj of each layer (lm_head is no LinearBase)

    _assert_near_the_quantized_reference(d, prompts, run_scheduler(sched, prompts, greedy_params(NEW_TOKENS)))


def test_gpu_format_split_k_add_norm_in_the_interpreter(fp8_v3, monkeypatch, tmp_path):
    """The GPU's decode path for block-fp8 o_proj / down_proj, here in the triton interpreter: with a split-K plan the
    skinny GEMM's sum kernel adds the residual (and, for the shared experts' down_proj, the routed output) and takes
    the next norm (fp8_block_linear_add_rmsnorm): every such call is fused, and the tokens stay transformers'."""
    import os

    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers import linear
    from sglang.srt.layers.decode_gemm import GemmConfig, GemmPlan

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton kernels on CPU tensors need TRITON_INTERPRET=1")
    # K of two 128 blocks for every row-parallel layer, so a split-K plan splits it: o_proj (4 heads x 64), the shared
    # experts' down_proj (2 x 128), the dense layer's down_proj (256)
    root = str(tmp_path)
    full = deepseek_v3_full(root + "/full", num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2)
    d = write_fp8_checkpoint(full, root + "/fp8", "block")
    prompts = fp8_v3[1]
    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = _scheduler(d)
    model = sched.model_runner.model
    split_k = GemmPlan(((64, GemmConfig(16, 16, 128, 4, 1, split_k=2)),))  # block_k 128: one scale block a step
    rows = [m for m in model.modules() if isinstance(m, linear.RowParallelLinear)]  # o_proj, down_proj, shared down
    for layer in rows:
        layer.gemm_plan = split_k
    calls = []
    real = linear.fp8_block_linear_add_rmsnorm

    def counted(*args):
        out = real(*args)
        calls.append(
            (out is not None, args[7] is not None)
        )  # (x, weight, scale, plan, residual, norm, eps, addend, ..)
        return out

    monkeypatch.setattr(linear, "fp8_block_linear_add_rmsnorm", counted)
    _assert_near_the_quantized_reference(d, prompts, run_scheduler(sched, prompts, greedy_params(NEW_TOKENS)))
    assert calls and all(fused for fused, _ in calls)
    assert any(with_addend for _, with_addend in calls)  # the shared experts' down_proj took the routed output


def _assert_near_the_quantized_reference(d: str, prompts, outs) -> None:
    """Against transformers under the same quantization (our absorbed attention sums in another order; kv_b_proj is
    absorbed in full precision): sglang.test.fp8_checkpoints.assert_near_the_quantized_reference."""
    reference = fake_quantized(load_hf_model(d + "-dequantized"), "block", weight_only=("kv_b_proj",))
    assert_near_the_quantized_reference(reference, prompts, outs)
