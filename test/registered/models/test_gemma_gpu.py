"""Gemma 2 and Gemma 3 (text) end to end on the GPU: sglang.Engine (triton attention with the cap and per-layer
windows, decode in CUDA graphs, the fused rotary/KV store after Gemma 3's q/k norms) against transformers on the
same tiny checkpoints (python/sglang/test/tiny_gemma.py, a 64-token window, prompts up to 700 tokens), both in
fp32 on the GPU; the sliding layers in the hybrid SWA pool, at upstream's default size and at one too small to keep
every prompt's window slots (released as they leave the window, prefills cut to its room), that one also sized after
graph capture (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1: the windowed layers' buffers a VMM arena of their own). The kernels' fp32 dots run in tf32, so near-ties may flip: at every step the engine's token must be
transformers' top-1 or within LOGIT_TOL of it, 90% of the steps exactly top-1, and the output logprobs (of the
capped logits) within LOGPROB_TOL."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="per-commit-cuda")

import random
import tempfile

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu
from sglang.test.tiny_gemma import COMMON, load_reference, write_tiny_gemma

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

NEW_TOKENS = 24
WINDOW = 64
LOGIT_TOL = 2e-2
LOGPROB_TOL = 2e-2


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
@pytest.mark.parametrize(
    "swa_ratio, post_capture",
    [(0.8, False), (0.05, False), (0.05, True)],  # 0.05: a window pool of 409 tokens for prompts up to 700
    ids=["0.8", "0.05", "0.05-post-capture"],
)
def test_engine_matches_transformers_on_gpu(family, swa_ratio, post_capture, monkeypatch):
    import sglang

    monkeypatch.setenv("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "1" if post_capture else "0")
    # head_dim 32: the fused rotary kernel on the GPU takes power-of-two head widths (real Gemmas: 128, 256).
    ckpt = write_tiny_gemma(
        family,
        tempfile.mkdtemp(prefix=f"tiny-{family}-"),
        sliding_window=WINDOW,
        max_position_embeddings=1024,
        head_dim=32,
    )
    rng = random.Random(3)
    prompts = [[rng.randrange(3, COMMON["vocab_size"]) for _ in range(n)] for n in (5, 63, 200, 700)]
    engine = sglang.Engine(
        model_path=ckpt,
        skip_tokenizer_init=True,
        device="cuda",
        dtype="float32",
        max_total_tokens=8192,
        cuda_graph_max_bs=8,
        mem_fraction_static=0.3,
        log_level="warning",
        swa_full_tokens_ratio=swa_ratio,
    )
    try:
        info = engine.get_server_info()
        assert info["memory_plan"]["path"] == ("post-capture" if post_capture else "static")
        assert info["memory_plan"]["swa_max_total_num_tokens"] == int(8192 * swa_ratio)
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
            return_logprob=True,
        )
    finally:
        engine.shutdown()
    ref = load_reference(ckpt, "cuda")
    steps = exact = 0
    for prompt, out in zip(prompts, outs):
        ids = out["output_ids"]
        assert len(ids) == NEW_TOKENS
        with torch.no_grad():
            logits = ref(torch.tensor([prompt + ids], device="cuda")).logits[0, len(prompt) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, -1)
        ours = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        for step, tok in enumerate(ids):
            gap = logits[step].max().item() - logits[step, tok].item()
            assert gap <= LOGIT_TOL, f"{family}: prompt of {len(prompt)}, step {step}: {gap:.4f} below the top-1"
            exact += int(logits[step].argmax().item() == tok)
            steps += 1
            assert abs(ours[step] - logprobs[step, tok].item()) < LOGPROB_TOL, f"{family}: step {step} logprob"
    assert exact >= 0.9 * steps, f"{family}: exact top-1 on {exact} of {steps} steps"
