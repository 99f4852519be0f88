"""Greedy tokens of the engine (triton attention, CUDA graphs, bf16) vs transformers on the same ~1B
random-weight Llama and Qwen3 checkpoints, and on Phi-3-mini's geometry with its sliding window shorter than
the longer prompts and Phi-4-mini's (partial rotary, longrope), 4 layers each.

Criterion (bf16): at every generated step the engine's token is transformers' top-1, or its
transformers logit is within BF16_TOL of the top-1 logit (near-ties flip in bf16). The test also
requires exact top-1 agreement on at least 90% of the steps.
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=380, suite="per-commit-cuda")

import tempfile

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, save_random_hf_model, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

BF16_TOL = 0.15
NEW_TOKENS = 24


@pytest.mark.parametrize("shape", ["Llama-1B-random", "Qwen3-1B-random", "Phi3-mini-random", "Phi4-mini-random"])
def test_greedy_matches_transformers(shape):
    from transformers import AutoModelForCausalLM

    import sglang

    ckpt = save_random_hf_model(shape_config_dir(shape), tempfile.mkdtemp(prefix="ckpt-"), seed=1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 32000, (n,), generator=gen).tolist() for n in (5, 17, 64, 200)]
    engine = sglang.Engine(
        model_path=ckpt,
        skip_tokenizer_init=True,
        max_total_tokens=32768,
        cuda_graph_max_bs=16,
        mem_fraction_static=0.5,
        log_level="warning",
    )
    try:
        outs = engine.generate(
            input_ids=prompts, sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        )
    finally:
        engine.shutdown()
    ref = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).cuda().eval()
    steps = exact = 0
    worst_gap = 0.0
    for prompt, out in zip(prompts, outs):
        ids = out["output_ids"]
        assert len(ids) == NEW_TOKENS
        full = torch.tensor([prompt + ids], device="cuda")
        with torch.no_grad():
            logits = ref(full).logits[0, len(prompt) - 1 : -1].float()  # the logits that chose each output token
        for step, tok in enumerate(ids):
            top = logits[step].max().item()
            gap = top - logits[step, tok].item()
            worst_gap = max(worst_gap, gap)
            exact += int(logits[step].argmax().item() == tok)
            steps += 1
            assert gap <= BF16_TOL, f"{shape}: step {step} token {tok} is {gap:.3f} below transformers' top-1"
    print(f"{shape}: exact top-1 agreement {exact}/{steps}, worst logit gap {worst_gap:.4f}")
    assert exact >= 0.9 * steps
