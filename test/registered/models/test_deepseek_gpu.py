"""DeepSeek-V2 / V3 (MLA + DeepSeekMoE) on the GPU: triton backend, bf16, the latent decode kernel in CUDA graphs.

- tiny transformers-written checkpoints (python/sglang/test/tiny_deepseek.py): greedy tokens vs transformers in
  bf16 (each token transformers' top-1 or within BF16_TOL of it, >= 90% exact), and CUDA graphs == eager;
- DeepSeek-V2-Lite whole (dummy weights of the real shapes): starts on the static path with the latent cell
  (27 x 576 x 2 = 31,104 bytes per token) and generates;
- post-capture sizing with the latent buffers as VMM ranges gives the static path's tokens.
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="per-commit-cuda")

import tempfile

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, shape_config_dir
from sglang.test.tiny_deepseek import make_tiny_deepseek

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

BF16_TOL = 0.15
NEW_TOKENS = 16
GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


def _prompts(vocab: int):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (1, 9, 40, 130)]


def _engine(path: str, **kw):
    import sglang

    return sglang.Engine(
        model_path=path, skip_tokenizer_init=True, max_total_tokens=8192, cuda_graph_max_bs=8, log_level="warning", **kw
    )


def _generate(path: str, prompts, **kw):
    engine = _engine(path, **kw)
    try:
        return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_tiny_deepseek_matches_transformers_and_graphs_match_eager(version):
    d, hf = make_tiny_deepseek(version, tempfile.mkdtemp(prefix=f"tiny-deepseek-{version}-"), seed=3)
    prompts = _prompts(hf.config.vocab_size)
    graphs = _generate(d, prompts)
    eager = _generate(d, prompts, disable_cuda_graph=True)
    assert graphs == eager, "decode in CUDA graphs must give the eager tokens"
    ref = hf.to(device="cuda", dtype=torch.bfloat16)
    for module in ref.modules():  # V3's router stays fp32, as ours (and upstream's) does: `.to(bfloat16)` would
        if hasattr(module, "e_score_correction_bias"):  # round its weight and correction bias, moving near-ties
            module.float()
    steps = exact = 0
    for prompt, ids in zip(prompts, graphs):
        assert len(ids) == NEW_TOKENS
        with torch.no_grad():
            logits = ref(torch.tensor([prompt + ids], device="cuda")).logits[0, len(prompt) - 1 : -1].float()
        for step, tok in enumerate(ids):
            gap = logits[step].max().item() - logits[step, tok].item()
            assert gap <= BF16_TOL, f"{version}: step {step} token {tok} is {gap:.3f} below transformers' top-1"
            exact += int(logits[step].argmax().item() == tok)
            steps += 1
    print(f"{version}: exact top-1 agreement {exact}/{steps}")
    assert exact >= 0.9 * steps


def test_deepseek_v2_lite_whole_with_dummy_weights():
    engine = _engine(shape_config_dir("DeepSeek-V2-Lite"), load_format="dummy", mem_fraction_static=0.85)
    try:
        plan = engine.get_server_info()["memory_plan"]
        outs = engine.generate(input_ids=_prompts(102400), sampling_params=GREEDY)
    finally:
        engine.shutdown()
    assert all(len(o["output_ids"]) == NEW_TOKENS for o in outs)
    assert plan["cell_size_bytes"] == 27 * 576 * 2 and plan["path"] == "static"
    print(f"DeepSeek-V2-Lite: {plan['max_total_num_tokens']} tokens of latent KV, weights {plan['weights_gb']:.2f} GiB")


def test_post_capture_sizing_with_latent_buffers(monkeypatch):
    """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 on an MLA model: the latent buffers are VMM ranges, the graphs are
    captured on them, the pool is sized after capture, and the tokens equal the static path's."""
    d, hf = make_tiny_deepseek("v2", tempfile.mkdtemp(prefix="tiny-deepseek-pc-"), seed=3)
    prompts = _prompts(hf.config.vocab_size)
    static = _generate(d, prompts)
    monkeypatch.setenv("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "1")
    engine = _engine(d)
    try:
        plan = engine.get_server_info()["memory_plan"]
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    finally:
        engine.shutdown()
    assert plan["path"] == "post-capture", plan["path_reason"]
    cfg = hf.config
    assert plan["cell_size_bytes"] == cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2  # bf16
    assert outs == static
