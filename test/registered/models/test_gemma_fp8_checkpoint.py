from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Native block-FP8 Gemma 2 / Gemma 3 (text) checkpoints: tiny_gemma's models (sliding window, soft-caps, Gemma 3's
# q/k norms and rope per layer type) with every part block-aligned (2 heads x 64, gate|up 256), every decoder linear
# quantized to e4m3 with `weight_scale_inv` per 128x128 block; the tied embeddings and norms in full precision.
# Greedy tokens equal transformers' (eager attention, tiny_gemma.load_reference) on the dequantized weights: on the
# CPU (dequantized at load), and in the GPU's format run on the CPU (the checkpoint's codes and scales as they are,
# activations quantized per 128-column group, against transformers quantizing the same activations).

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import fake_quantized, write_fp8_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler
from sglang.test.tiny_gemma import COMMON, load_reference, write_tiny_gemma

NEW_TOKENS = 8
BLOCK_ALIGNED = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64, intermediate_size=256)
_BUILT: dict = {}


def _checkpoint(family: str, tmp_path_factory):
    """(fp8 checkpoint dir, prompts, its tensors), once per family."""
    if family not in _BUILT:
        root = tmp_path_factory.mktemp(f"{family}-fp8")
        full = write_tiny_gemma(family, str(root / "full"), **BLOCK_ALIGNED)
        d = write_fp8_checkpoint(full, str(root / "fp8"), "block")
        rng = random.Random(family)
        prompts = [[rng.randrange(3, COMMON["vocab_size"]) for _ in range(n)] for n in (3, 17)]  # past the window
        _BUILT[family] = (d, prompts, load_file(f"{d}/model.safetensors"))
    return _BUILT[family]


def _scheduler(d: str):
    return make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_cpu_dequantizes_every_weight(family, tmp_path_factory):
    d, prompts, _ = _checkpoint(family, tmp_path_factory)
    ref = hf_greedy(load_reference(d + "-dequantized"), prompts, NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    sched = _scheduler(d)
    assert all(p.dtype == torch.float32 for p in sched.model_runner.model.parameters())
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gpu_format_keeps_the_checkpoints_fp8(family, tmp_path_factory, monkeypatch):
    import sglang.srt.configs.model_config as model_config
    from sglang.srt.layers.linear import LinearBase

    d, prompts, ckpt = _checkpoint(family, tmp_path_factory)
    monkeypatch.setattr(model_config, "linear_weight_format", lambda *a: "fp8_block")  # as on the GPU
    sched = _scheduler(d)
    model = sched.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert len(linears) == 4 * len(model.model.layers) and all(m.is_block_fp8 for m in linears)
    layer, name = model.model.layers[2], "model.layers.2."
    qkv = [f"{name}self_attn.{p}_proj." for p in "qkv"]
    assert torch.equal(
        layer.self_attn.qkv_proj.weight.view(torch.uint8),
        torch.cat([ckpt[p + "weight"] for p in qkv]).view(torch.uint8),
    )
    assert torch.equal(
        layer.self_attn.qkv_proj.weight_scale_inv, torch.cat([ckpt[p + "weight_scale_inv"] for p in qkv])
    )
    down = name + "mlp.down_proj."
    assert torch.equal(layer.mlp.down_proj.weight.view(torch.uint8), ckpt[down + "weight"].view(torch.uint8))
    assert torch.equal(layer.mlp.down_proj.weight_scale_inv, ckpt[down + "weight_scale_inv"])
    ref = hf_greedy(fake_quantized(load_reference(d + "-dequantized"), "block"), prompts, NEW_TOKENS)
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref
