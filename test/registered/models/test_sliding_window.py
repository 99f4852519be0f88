from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# MistralForCausalLM with a sliding window shorter than the prompts (and a Qwen2 whose upper layers slide):
# greedy tokens identical to transformers on the same weights, through the in-process scheduler on the CPU
# (torch-native attention), also with chunked prefill cutting the window across chunks and with a cached
# prefix. The same weights without the window answer differently, so the window is what is being matched.

import random

import pytest
import torch

from sglang.srt.configs.sliding_window import NO_WINDOW, layer_sliding_windows
from sglang.test.runners import (
    greedy_params,
    hf_greedy,
    load_hf_model,
    make_scheduler,
    run_scheduler,
    save_tiny_hf_model,
)
from sglang.test.tiny_sliding_window import WINDOW, mistral_config, qwen2_config

NEW_TOKENS = 16


def prompts():
    rng = random.Random(7)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in (5, 13, 30, 47)]


def test_layer_windows_follow_transformers():
    assert layer_sliding_windows(mistral_config(WINDOW)) == (WINDOW,) * 3
    assert layer_sliding_windows(mistral_config(None)) == (NO_WINDOW,) * 3
    assert layer_sliding_windows(qwen2_config()) == (NO_WINDOW, NO_WINDOW, WINDOW, WINDOW)
    config = qwen2_config()
    config.layer_types = ["full_attention", "chunked_attention", "full_attention", "full_attention"]
    with pytest.raises(ValueError, match="chunked_attention"):
        layer_sliding_windows(config)


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_window_matches_transformers(arch, tmp_path):
    d = save_tiny_hf_model(mistral_config(WINDOW) if arch == "mistral" else qwen2_config(), str(tmp_path / arch))
    ref = hf_greedy(load_hf_model(d), prompts(), NEW_TOKENS)
    from transformers import AutoModelForCausalLM

    full = {"layer_types": ["full_attention"] * 4} if arch == "qwen2" else {}
    plain = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, sliding_window=None, **full)
    unwindowed = hf_greedy(plain.eval(), prompts(), NEW_TOKENS)  # the same weights attending to everything
    assert unwindowed != ref, "the window must change some answer, or this test proves nothing"

    for chunk in (None, 8):  # 8: the prefill's chunks see their window partly in the cached prefix
        sched = make_scheduler(
            reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, chunked_prefill_size=chunk
        )
        outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
        assert [o.output_ids for o in outs] == ref, f"chunked_prefill_size={chunk}"
        # Again: the prompts now hit the radix cache, so only their last tokens are prefilled.
        again = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
        assert [o.output_ids for o in again] == ref
        assert any(o.cached_tokens > WINDOW for o in again)


@pytest.mark.parametrize("arch,page_size", [("mistral", 1), ("qwen2", 4)])
def test_small_window_pool_matches_transformers(arch, page_size, tmp_path):
    """The hybrid SWA pool under pressure: a window pool of 64 tokens (--swa-full-tokens-ratio) for requests of
    up to 63 tokens, four at a time, so requests give their out-of-window tokens' window slots back while they run,
    prefills are cut to the pool's room, and cached prefixes are reused only where their window was kept. Greedy
    tokens stay transformers' (Mistral windows every layer; this Qwen2 two of four, beside two full ones, in pages of 4)."""
    d = save_tiny_hf_model(mistral_config(WINDOW) if arch == "mistral" else qwen2_config(), str(tmp_path / arch))
    ref = hf_greedy(load_hf_model(d), prompts(), NEW_TOKENS)
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        swa_full_tokens_ratio=0.0625,
        page_size=page_size,
    )
    allocator = sched.model_runner.token_to_kv_pool_allocator
    assert (allocator.size, allocator.swa_size) == (1024, 64)
    assert sum(len(p) + NEW_TOKENS for p in prompts()) > 2 * allocator.swa_size  # the requests cannot keep it all
    for _ in range(2):  # the second time through the radix cache, with what it kept of the windows
        outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
        assert [o.output_ids for o in outs] == ref
    assert allocator.swa_available_size() + sched.tree_cache.swa_evictable_size() == allocator.swa_size  # none leaked
    assert sched.model_runner.memory_plan.swa_max_total_num_tokens == 64


def test_window_pool_off_keeps_one_pool(tmp_path):
    """--disable-hybrid-swa-memory: every layer in the one pool (the window still honoured by the kernels)."""
    d = save_tiny_hf_model(mistral_config(WINDOW), str(tmp_path / "mistral"))
    sched = make_scheduler(
        reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, disable_hybrid_swa_memory=True
    )
    assert not sched.model_runner.token_to_kv_pool.has_window_pool
    plan = sched.model_runner.memory_plan
    assert plan.swa_layers == 0 and "one pool: --disable-hybrid-swa-memory" in " ".join(plan.notes)
    outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == hf_greedy(load_hf_model(d), prompts(), NEW_TOKENS)
