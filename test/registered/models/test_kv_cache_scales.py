from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# A checkpoint that ships KV cache scales (model.layers.N.self_attn.k_scale / v_scale, as fp8 checkpoints
# calibrated for an fp8 KV cache do), on a tiny random Llama (CPU, fp32 activations, in-process scheduler):
#   * --kv-cache-dtype fp8_e4m3: every attention layer stores K / k_scale and V / v_scale in e4m3 and reads them
#     back times the scales; greedy generation equals transformers' model whose attention sees K and V rounded
#     that way, token for token, log-probabilities nearly so, and the scales matter (scale 1 answers otherwise);
#   * a bf16 (here fp32) KV cache: the loader accepts the scale tensors, ignores them with one log line, and the
#     answers are the unquantized model's.

import logging
import os
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.layers.radix_attention import RadixAttention
from sglang.test.runners import (
    greedy_params,
    hf_greedy,
    load_hf_model,
    make_scheduler,
    make_tiny_hf_model,
    run_scheduler,
)

NEW_TOKENS = 16
FP8 = torch.float8_e4m3fn
# Per layer, deliberately far from 1 and from each other: a scale above 1 pushes K/V (|x| up to ~3) into e4m3's
# subnormals, one far below 1 uses its top range; an engine that dropped either side of the scaling (store or
# read) would answer very differently.
K_SCALES = [0.0071, 0.37, 5.3]
V_SCALES = [0.0065, 1.7, 0.29]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = make_tiny_hf_model("llama", str(tmp_path_factory.mktemp("kv-scales")), seed=3)
    path = os.path.join(d, "model.safetensors")
    state = load_file(path)
    for i, (k, v) in enumerate(zip(K_SCALES, V_SCALES)):
        state[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k)
        state[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v)
    save_file(state, path, metadata={"format": "pt"})
    return d


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(5)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 6, 23)]


def fake_fp8_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x / scale).clamp(-448.0, 448.0).to(FP8).float() * scale


def hf_with_kv_scales(d: str, k_scales, v_scales):
    """transformers' model whose attention sees K and V as an fp8 cache with these scales holds them."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, *args, **kwargs):
        i = module.layer_idx
        key, value = fake_fp8_kv(key, k_scales[i]), fake_fp8_kv(value, v_scales[i])
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    name = f"fp8-kv-{'-'.join(map(str, k_scales))}"
    AttentionInterface.register(name, attention)
    model = load_hf_model(d)
    model.set_attn_implementation(name)
    return model


@torch.no_grad()
def _logprobs(model, prompt, tokens):
    logp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
    return logp[pos, torch.tensor(tokens)]


def test_fp8_kv_cache_uses_the_checkpoint_scales(checkpoint, prompts):
    sched = make_scheduler(
        reuse_model=False,
        model_path=checkpoint,
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        kv_cache_dtype="fp8_e4m3",
    )
    layers = [m for m in sched.model_runner.model.modules() if isinstance(m, RadixAttention)]
    assert [m.k_scale for m in layers] == pytest.approx(K_SCALES)
    assert [m.v_scale for m in layers] == pytest.approx(V_SCALES)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS), return_logprob=True)

    scaled = hf_with_kv_scales(checkpoint, K_SCALES, V_SCALES)
    unit = hf_with_kv_scales(checkpoint, [1.0] * 3, [1.0] * 3)
    ref = hf_greedy(scaled, prompts, NEW_TOKENS)
    ours, fake, fake_unit = [], [], []
    for prompt, out, r in zip(prompts, outs, ref):
        assert out.output_ids == r, f"prompt of {len(prompt)} tokens"
        ours.append(torch.tensor(out.logprobs))
        fake.append(_logprobs(scaled, prompt, r))
        fake_unit.append(_logprobs(unit, prompt, r))
    ours, fake, fake_unit = torch.cat(ours), torch.cat(fake), torch.cat(fake_unit)
    # fp8 rounding is a step function: a last-bit difference upstream of it can flip one value, so most
    # positions are equal and the mean is far below what the scales change.
    diff = (ours - fake).abs()
    assert diff.median().item() <= 1e-4, diff
    assert diff.mean().item() < 0.2 * (fake - fake_unit).abs().mean().item()


def test_a_full_precision_kv_cache_ignores_the_scales(checkpoint, prompts, caplog):
    with caplog.at_level(logging.INFO, logger="sglang.srt.model_loader.kv_scales"):
        sched = make_scheduler(
            reuse_model=False, model_path=checkpoint, skip_tokenizer_init=True, max_total_tokens=1024
        )
    ignored = [r for r in caplog.records if "are ignored" in r.getMessage()]
    assert len(ignored) == 1 and "3 attention layers" in ignored[0].getMessage()
    layers = [m for m in sched.model_runner.model.modules() if isinstance(m, RadixAttention)]
    assert all(m.k_scale is None and m.v_scale is None for m in layers)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == hf_greedy(load_hf_model(checkpoint), prompts, NEW_TOKENS)
