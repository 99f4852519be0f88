"""Gemma 2 and Gemma 3 (text) against transformers on tiny random checkpoints that transformers wrote (save_pretrained),
fp32 on the CPU, through the in-process scheduler (one per model): a sliding window shorter than the prompts,
attention logit soft-capping (Gemma 2) and final logit soft-capping on, rope per layer type with a scaled global
rope (Gemma 3). Greedy tokens identical to transformers, output and prompt logprobs equal to its log-softmax of the
capped logits, also with chunked prefill cutting the window, with cached prefixes longer than the window, and with the
sliding layers in a window pool too small to keep every request's window (the hybrid SWA pool under pressure). The
same weights without the attention cap or the window give other greedy tokens in transformers, and without the
final cap other logprobs, so each is matched. The GPU's norm and rotary kernels, run in the triton interpreter through
the same scheduler, give the same tokens."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=50, suite="per-commit-cpu")

import random

import pytest
import torch

from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler
from sglang.test.tiny_gemma import COMMON, GEMMA_CONFIGS, WINDOW, load_reference, write_tiny_gemma

NEW_TOKENS = 12
PROMPT_LENS = (3, 14, 29, 41)
TOL = 1e-4


def prompts():
    rng = random.Random(11)
    return [[rng.randrange(3, COMMON["vocab_size"]) for _ in range(n)] for n in PROMPT_LENS]


def hf_model(path: str, **overrides):
    return load_reference(path, **overrides)


@torch.no_grad()
def hf_log_softmax(model, ids):
    return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


_BUILT: dict = {}


@pytest.fixture(scope="module", params=sorted(GEMMA_CONFIGS))
def tiny(request, tmp_path_factory):
    """(family, checkpoint dir, transformers model, greedy reference, our scheduler), built once per family."""
    family = request.param
    if family not in _BUILT:
        d = write_tiny_gemma(family, str(tmp_path_factory.mktemp(family)))
        hf = hf_model(d)
        ref = hf_greedy(hf, prompts(), NEW_TOKENS)
        # Chunks of 16 tokens: the longer prompts' windows straddle a chunk boundary (the cached prefix).
        sched = make_scheduler(
            reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, chunked_prefill_size=16
        )
        _BUILT[family] = (family, d, hf, ref, sched)
    return _BUILT[family]


def test_greedy_tokens_and_logprobs_match_transformers(tiny):
    family, d, hf, ref, sched = tiny
    assert type(sched.model_runner.model).__name__ == hf.config.architectures[0]
    outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS), return_logprob=True, logprob_start_len=0)
    for prompt, out, r in zip(prompts(), outs, ref):
        assert out.output_ids == r, f"{family}, prompt of {len(prompt)} tokens"
        lsm = hf_log_softmax(hf, prompt + r)
        expected = lsm[torch.arange(len(prompt) - 1, len(prompt) + len(r) - 1), torch.tensor(r)]
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=TOL, rtol=0)
        scored = out.prompt["input_token"][1:]  # position 0 has no logprob
        assert [t for _, t in scored] == prompt[1:]
        expected_prompt = [lsm[pos - 1, prompt[pos]].item() for pos in range(1, len(prompt))]
        assert max((abs(v - e) for (v, _), e in zip(scored, expected_prompt)), default=0.0) < TOL
    # Again: the prompts now hit the radix cache (prefixes longer than the window), only their tails prefilled.
    again = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in again] == ref
    assert any(o.cached_tokens > WINDOW for o in again)
    # Not degenerate: different prompts, different continuations, several distinct tokens each.
    assert len({tuple(r) for r in ref}) == len(PROMPT_LENS) and all(len(set(r)) > 2 for r in ref)


def test_a_small_window_pool_keeps_the_tokens(tiny):
    """The sliding layers in a window pool of 32 tokens (--swa-full-tokens-ratio; one pool holds 1,024) for requests
    of up to 53 tokens, four at a time: out-of-window slots released while they run, prefills cut to the pool's room;
    greedy tokens still transformers'."""
    family, d, hf, ref, _ = tiny
    small = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        chunked_prefill_size=16,
        swa_full_tokens_ratio=0.032,
    )
    assert small.allocator.swa_size == 32 < sum(PROMPT_LENS) + len(PROMPT_LENS) * NEW_TOKENS
    for _ in range(2):
        assert [o.output_ids for o in run_scheduler(small, prompts(), greedy_params(NEW_TOKENS))] == ref, family


FEATURES = ["final_logit_softcapping", "attn_logit_softcapping", "sliding_window", "rope_local_base_freq"]


@pytest.mark.parametrize("feature", FEATURES)
def test_each_feature_changes_the_reference(tiny, feature):
    """The same weights without the feature answer differently in transformers, so matching it above is evidence:
    other greedy tokens without the attention cap, the window (one longer than every sequence) or Gemma 3's own
    rope for the sliding layers; other logprobs without the final cap (tanh keeps the order of the logits, so greedy
    tokens cannot show it, sampling and logprobs do)."""
    family, d, hf, ref, _ = tiny
    if feature == "attn_logit_softcapping" and family == "gemma3":
        pytest.skip("transformers' Gemma 3 attention does not soft-cap (a config setting it is refused)")
    if feature == "rope_local_base_freq" and family == "gemma2":
        pytest.skip("Gemma 2 has one rope for every layer")
    overrides = {feature: None}
    if feature == "sliding_window":
        overrides = {"sliding_window": COMMON["max_position_embeddings"]}
    if feature == "rope_local_base_freq":  # the sliding layers get the global layers' rope
        full = dict(hf.config.rope_parameters["full_attention"])
        overrides = {"rope_parameters": {"sliding_attention": full, "full_attention": full}}
    plain = hf_model(d, **overrides)
    if feature == "final_logit_softcapping":
        ids = prompts()[1] + ref[1]
        assert (hf_log_softmax(plain, ids) - hf_log_softmax(hf, ids)).abs().max() > 100 * TOL
        return
    assert hf_greedy(plain, prompts(), NEW_TOKENS) != ref, f"{feature} changes no answer: this test proves nothing"


def test_gpu_kernels_in_the_interpreter_give_the_same_tokens(tiny, monkeypatch):
    """The GPU's path through the decoder, here in the triton interpreter on CPU tensors: each (1 + w) norm one
    kernel, each block's post-norm with its residual add and the next norm one kernel (the stream updated in place),
    Gemma 3's q/k norms inside the rotary kernel, the GeGLU one kernel: transformers' greedy tokens, and every such
    call took its kernel."""
    import os

    from sglang.srt.layers import fused_elementwise, kernel_dispatch

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton kernels on CPU tensors need TRITON_INTERPRET=1")
    family, d, hf, ref, _ = tiny
    monkeypatch.setattr(kernel_dispatch, "runs_kernel", lambda t: True)
    norms, rotary, geglu = [], [], []
    real_norm, real_rotary = fused_elementwise.gemma_rmsnorm, fused_elementwise.apply_rotary_inplace
    real_geglu = fused_elementwise.gelu_tanh_and_mul

    def counted_norm(*args, **kwargs):
        norms.append(kwargs.get("sandwich") is not None)
        return real_norm(*args, **kwargs)

    def counted_rotary(*args, **kwargs):
        qk_norm = kwargs.get("qk_norm")
        rotary.append(qk_norm is not None and qk_norm.unit_offset)
        return real_rotary(*args, **kwargs)

    monkeypatch.setattr(fused_elementwise, "gemma_rmsnorm", counted_norm)
    monkeypatch.setattr(fused_elementwise, "apply_rotary_inplace", counted_rotary)
    monkeypatch.setattr(fused_elementwise, "gelu_tanh_and_mul", lambda x: geglu.append(x.shape[0]) or real_geglu(x))
    sched = make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024)
    outs = run_scheduler(sched, prompts(), greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref, family
    layers = hf.config.num_hidden_layers
    forwards = norms.count(False)  # one plain norm a forward (the first layer's input), the rest are sandwiches
    assert forwards > 0 and norms.count(True) == 2 * layers * forwards
    assert len(rotary) == layers * forwards and all(rotary) == (family == "gemma3") and any(rotary) == all(rotary)
    assert len(geglu) == layers * forwards
