from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# The math-changing config fields of docs/model_support.md that no other model test sets, honoured: tiny random
# checkpoints written by transformers with the field set give greedy tokens identical to transformers' through
# the in-process scheduler (fp32, CPU), and the same weights without the field answer differently (so the
# match is about the field):
# - Mixtral's sliding_window (every layer);
# - Qwen3-MoE's use_sliding_window (every layer) with decoder_sparse_step 2 (layers 0 and 2 dense);
# - Qwen2-MoE's use_sliding_window + max_window_layers (its own rule: even-numbered layers below it slide);
# - Llama's attention_bias (q/k/v/o biases), a head_dim apart from hidden_size / heads, and a yarn rope
#   (its frequencies and attention factor).

import random

import pytest
import torch

from sglang.srt.configs.sliding_window import NO_WINDOW, layer_sliding_windows
from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, make_tiny_hf_model, run_scheduler
from sglang.test.tiny_moe_families import make_tiny_family

NEW_TOKENS = 8
WINDOW = 12
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}

CASES = {
    "mixtral_window": ("mixtral", dict(sliding_window=WINDOW)),
    "qwen3_moe_window_sparse_step": (
        "qwen3_moe",
        dict(use_sliding_window=True, sliding_window=WINDOW, decoder_sparse_step=2),
    ),
    "qwen2_moe_window_layers": ("qwen2_moe", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "llama_bias_head_dim_yarn": ("llama", dict(attention_bias=True, head_dim=32, rope_parameters=YARN)),
}
# The same weights without the field (transformers' keyword overrides of the saved config).
WITHOUT = {
    "mixtral_window": dict(sliding_window=None),
    "qwen3_moe_window_sparse_step": dict(sliding_window=None),
    "qwen2_moe_window_layers": dict(layer_types=["full_attention"] * 3),
    "llama_bias_head_dim_yarn": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


def prompts():
    rng = random.Random(5)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in (5, 13, 30)]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(case, checkpoint dir, transformers model, greedy reference)."""
    family, fields = CASES[request.param]
    out = str(tmp_path_factory.mktemp(request.param))
    if family == "llama":
        d = make_tiny_hf_model("llama", out, seed=3, **fields)
        from sglang.test.runners import load_hf_model

        hf = load_hf_model(d)
    else:
        d, hf = make_tiny_family(family, out, seed=3, **fields)
    return request.param, d, hf, hf_greedy(hf, prompts(), NEW_TOKENS)


def test_layer_windows_follow_the_config(case):
    name, _, hf, _ = case
    want = {
        "mixtral_window": (WINDOW,) * 2,
        "qwen3_moe_window_sparse_step": (WINDOW,) * 3,
        "qwen2_moe_window_layers": (WINDOW, NO_WINDOW, NO_WINDOW),
        "llama_bias_head_dim_yarn": (NO_WINDOW,) * 3,
    }[name]
    assert layer_sliding_windows(hf.config) == want


def test_field_changes_the_answer(case):
    name, d, _, ref = case
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **WITHOUT[name])
    assert hf_greedy(plain.eval(), prompts(), NEW_TOKENS) != ref


def test_greedy_matches_transformers(case):
    name, d, hf, ref = case
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, log_level="warning")
    model = sched.model_runner.model
    if name == "qwen3_moe_window_sparse_step":  # decoder_sparse_step 2: only layer 1 has experts
        kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
        assert kinds == ["LlamaMLP", "Qwen3MoeSparseMoeBlock", "LlamaMLP"]
    if name == "llama_bias_head_dim_yarn":
        attn = model.model.layers[0].self_attn
        assert attn.head_dim == 32 and attn.qkv_proj.bias is not None and attn.o_proj.bias is not None
    outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
    for prompt, out, r in zip(prompts(), outs, ref):
        assert out.output_ids == r, f"{name}, prompt of {len(prompt)} tokens"
