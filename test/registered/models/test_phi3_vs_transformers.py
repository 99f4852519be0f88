from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# Phi3ForCausalLM (Phi-3 / Phi-3.5-mini / Phi-4-mini) against transformers on tiny random checkpoints that
# transformers wrote (fused qkv_proj / gate_up_proj), fp32 on the CPU, through the in-process scheduler:
# greedy tokens identical for prompts of several lengths.
# - "window": Phi-3-mini-4k's shape: every layer slides, the window (12) shorter than the longer prompts,
#   also with chunked prefill cutting the window across chunks;
# - "longrope": Phi-4-mini's shape: partial_rotary_factor 0.75 and longrope with non-trivial short factors
#   and max_position_embeddings / original_max_position_embeddings = 8 (attention factor sqrt(1.5)); the
#   served context is capped at original_max_position_embeddings (64), which every sequence here stays under.
# Each feature is checked to matter: the same weights without it answer differently.

import math
import random

import pytest
import torch

from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler
from sglang.test.tiny_moe_families import make_tiny_family, tiny_family_config

NEW_TOKENS = 10
WINDOW = 12
ORIGINAL_MAX = 64
ROTARY_HALF = int(16 * 0.75) // 2  # head_dim 64 / 4 heads = 16, three quarters of it rotating


def _longrope() -> dict:
    rng = random.Random(3)
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "short_factor": [round(rng.uniform(1.0, 4.0), 3) for _ in range(ROTARY_HALF)],
        "long_factor": [round(rng.uniform(4.0, 16.0), 3) for _ in range(ROTARY_HALF)],
    }


VARIANTS = {
    "window": dict(sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "longrope": dict(
        rope_parameters=_longrope(),
        max_position_embeddings=8 * ORIGINAL_MAX,
        original_max_position_embeddings=ORIGINAL_MAX,
    ),
}


def prompts():
    rng = random.Random(11)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in (5, 13, 30, 47)]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny(request, tmp_path_factory):
    """(variant, checkpoint dir, transformers model, greedy reference), one checkpoint per variant."""
    d, hf = make_tiny_family(
        "phi3", str(tmp_path_factory.mktemp(f"phi3_{request.param}")), seed=9, **VARIANTS[request.param]
    )
    return request.param, d, hf, hf_greedy(hf, prompts(), NEW_TOKENS)


def test_checkpoint_is_fused(tiny):
    """The checkpoint carries Phi-3's fused projections (what the merged layers' loaders take whole)."""
    _, d, _, _ = tiny
    from safetensors import safe_open

    with safe_open(f"{d}/model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(".q_proj." in n or ".gate_proj." in n for n in names)


def test_feature_changes_the_answer(tiny):
    """The window / the longrope + partial rotary embedding must matter on these weights, or matching proves
    nothing about them."""
    variant, d, _, ref = tiny
    from transformers import AutoModelForCausalLM

    if variant == "window":
        plain = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, sliding_window=None)
    else:
        rope = {"rope_type": "default", "rope_theta": 10000.0}  # full rotary, no factors, no attention factor
        plain = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, rope_parameters=rope)
    assert hf_greedy(plain.eval(), prompts(), NEW_TOKENS) != ref


def test_greedy_matches_transformers(tiny):
    variant, d, hf, ref = tiny
    chunks = (None, 8) if variant == "window" else (None,)  # 8: a prefill chunk's window reaches into the cache
    for chunk in chunks:
        sched = make_scheduler(
            model_path=d,
            skip_tokenizer_init=True,
            max_total_tokens=1024,
            chunked_prefill_size=chunk,
            log_level="warning",
        )
        assert type(sched.model_runner.model).__name__ == "Phi3ForCausalLM"
        outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
        for prompt, out, r in zip(prompts(), outs, ref):
            assert out.output_ids == r, f"{variant}, chunked_prefill_size={chunk}, prompt of {len(prompt)} tokens"
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate: different prompts, different answers


def test_longrope_context_and_attention_factor():
    """longrope runs to original_max_position_embeddings (the short factors' range) and scales cos/sin by
    transformers' attention factor: sqrt(1 + ln(8) / ln(64)) here."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    hf_config = tiny_family_config("phi3", architectures=["Phi3ForCausalLM"], **VARIANTS["longrope"])
    config = ModelConfig.from_hf_config(hf_config)
    assert config.context_len == ORIGINAL_MAX and hf_config.max_position_embeddings == 8 * ORIGINAL_MAX
    with pytest.raises(ValueError, match="original_max_position_embeddings 64"):
        ModelConfig.from_hf_config(hf_config, context_length=ORIGINAL_MAX + 1)
    factor = math.sqrt(1 + math.log(8) / math.log(64))
    assert Phi3RotaryEmbedding(hf_config).attention_scaling == pytest.approx(factor)
    ours = RotaryEmbedding(hf_config, config.head_dim, ORIGINAL_MAX, torch.float32)
    assert ours.rotary_dim == 2 * ROTARY_HALF and ours.cos_cache[0, 0].item() == pytest.approx(factor)  # cos(0) = 1
