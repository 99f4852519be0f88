from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Native block-FP8 checkpoints of the softmax-routed MoE families that share models/sparse_moe.py: Mixtral (experts
# named block_sparse_moe.experts.N.w1/w2/w3 in the checkpoint), Qwen2-MoE (q/k/v
# biases, a shared expert behind its sigmoid gate, a dense layer) and OLMoE (q/k norms over the whole projection,
# clip_qkv). Tiny transformers-written models (merged parts multiples of 128), every decoder linear quantized to e4m3
# with `weight_scale_inv` per 128x128 block; routers, the shared expert's gate, norms, embeddings, lm_head in full
# precision. Greedy tokens equal transformers':
# - on the CPU (every weight dequantized at load), against transformers on the dequantized weights;
# - in the GPU's format run on the CPU (fp8 q|k|v, o_proj, shared expert and dense MLP with activations quantized per
#   128-column group; FP8 routed experts, weight-only), against transformers quantizing the same activations.

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import block_aligned_family, fake_quantized, write_fp8_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, load_hf_model, make_scheduler, run_scheduler

NEW_TOKENS = 8
L0 = "model.layers.0."
_BUILT: dict = {}


def _checkpoint(family: str, tmp_path_factory):
    """(fp8 checkpoint dir, prompts, its tensors), once per family."""
    if family not in _BUILT:
        root = tmp_path_factory.mktemp(f"{family}-fp8")
        d = write_fp8_checkpoint(block_aligned_family(family, str(root / "full")), str(root / "fp8"), "block")
        rng = random.Random(family)
        prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (3, 19)]
        _BUILT[family] = (d, prompts, load_file(f"{d}/model.safetensors"))
    return _BUILT[family]


def _scheduler(d: str):
    return make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "olmoe"])
def test_cpu_dequantizes_every_weight(family, tmp_path_factory):
    d, prompts, _ = _checkpoint(family, tmp_path_factory)
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    sched = _scheduler(d)
    assert all(p.dtype == torch.float32 for p in sched.model_runner.model.parameters())
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "olmoe"])
def test_gpu_format_keeps_the_checkpoints_fp8(family, tmp_path_factory, monkeypatch):
    """What the GPU builds (linear_weight_format "fp8_block"), run on the CPU: every decoder linear holds the
    checkpoint's e4m3 codes and block scales (q/k/v biases in full precision), the routed experts the FP8 fused-MoE
    layout; the routers and Qwen2-MoE's shared-expert gate stay in full precision."""
    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers.linear import LinearBase

    d, prompts, ckpt = _checkpoint(family, tmp_path_factory)
    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = _scheduler(d)
    model = sched.model_runner.model
    layer = model.model.layers[0]
    qkv = [L0 + f"self_attn.{p}_proj." for p in "qkv"]
    assert torch.equal(
        layer.self_attn.qkv_proj.weight.view(torch.uint8),
        torch.cat([ckpt[p + "weight"] for p in qkv]).view(torch.uint8),
    )
    assert torch.equal(
        layer.self_attn.qkv_proj.weight_scale_inv, torch.cat([ckpt[p + "weight_scale_inv"] for p in qkv])
    )
    experts = layer.mlp.experts
    assert experts.quant_method.name == "FP8"
    e, (gate, up, down) = L0 + "mlp.experts.3.", ("gate_proj", "up_proj", "down_proj")
    if family == "mixtral":  # the checkpoint's own names
        e, (gate, up, down) = L0 + "block_sparse_moe.experts.3.", ("w1", "w3", "w2")
    gate_up = torch.cat([ckpt[f"{e}{gate}.weight"], ckpt[f"{e}{up}.weight"]])
    assert torch.equal(experts.w13_weight[3].view(torch.uint8), gate_up.view(torch.uint8))
    assert torch.equal(experts.w2_weight_scale_inv[3], ckpt[f"{e}{down}.weight_scale_inv"])
    full_precision = {"mlp.gate", "mlp.shared_expert_gate"}
    for name, m in model.named_modules():
        if isinstance(m, LinearBase):
            assert m.is_block_fp8 == (name.split(".", 3)[-1] not in full_precision), name
    if family == "qwen2_moe":
        down = layer.mlp.shared_expert.down_proj
        assert torch.equal(
            down.weight.view(torch.uint8), ckpt[L0 + "mlp.shared_expert.down_proj.weight"].view(torch.uint8)
        )
        assert model.model.layers[1].mlp.gate_up_proj.is_block_fp8  # the dense layer (mlp_only_layers)

    reference = fake_quantized(load_hf_model(d + "-dequantized"), "block", weight_only=("gate", "shared_expert_gate"))
    ref = hf_greedy(reference, prompts, NEW_TOKENS)
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref
