from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="per-commit-cpu")

# Greedy generation matches transformers token for token, on the same weights, fp32 on the CPU:
#   * SmolLM2-135M-Instruct from its Q4_1 GGUF (our GGUF loader vs transformers reading the SAME file),
#     through the real process pipeline (sglang.Engine: tokenizer manager, scheduler, detokenizer);
#   * tiny random Llama / Qwen2 / Qwen3 checkpoints (save_pretrained directories), through the
#     in-process Scheduler with --skip-tokenizer-init and input ids; log-probabilities too.

import random

import pytest
import torch

import sglang
from sglang.test.runners import (
    SMOLLM2,
    SMOLLM2_PROMPTS,
    greedy_params,
    hf_greedy,
    load_hf_model,
    make_scheduler,
    make_tiny_hf_model,
    run_scheduler,
    smollm2_engine,
)

NEW_TOKENS = 32
PROMPTS = SMOLLM2_PROMPTS[:8]


@pytest.fixture(scope="module")
def smol_engine():
    engine = smollm2_engine()  # sglang.Engine: the real scheduler + detokenizer processes
    assert isinstance(engine, sglang.Engine) and all(p.is_alive() for p in engine.processes)
    return engine


@pytest.fixture(scope="module")
def smol_prompt_ids(smol_engine):
    tok = smol_engine.tokenizer_manager.tokenizer
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def smol_hf():
    model = load_hf_model(SMOLLM2)  # transformers reads and dequantizes the same GGUF file
    assert model.dtype == torch.float32
    return model


@pytest.fixture(scope="module")
def smol_reference(smol_hf, smol_prompt_ids):
    return hf_greedy(smol_hf, smol_prompt_ids, NEW_TOKENS)


def test_smollm2_engine_matches_transformers(smol_engine, smol_prompt_ids, smol_reference):
    outs = smol_engine.generate(input_ids=smol_prompt_ids, sampling_params=greedy_params(NEW_TOKENS))
    assert len(outs) == len(PROMPTS)
    tok = smol_engine.tokenizer_manager.tokenizer
    for prompt, out, ref in zip(PROMPTS, outs, smol_reference):
        assert len(ref) == NEW_TOKENS
        assert out["output_ids"] == ref, f"{prompt!r}: ours {tok.decode(out['output_ids'])!r} vs HF {tok.decode(ref)!r}"
        assert out["meta_info"]["completion_tokens"] == NEW_TOKENS
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert out["text"] == tok.decode(ref, skip_special_tokens=True)
    # The references are not degenerate: the prompts lead to different continuations.
    assert len({tuple(r) for r in smol_reference}) == len(PROMPTS)


def test_smollm2_text_prompt_equals_its_input_ids(smol_engine, smol_prompt_ids, smol_reference):
    out = smol_engine.generate(PROMPTS[0], greedy_params(NEW_TOKENS))
    assert out["output_ids"] == smol_reference[0]
    assert out["meta_info"]["prompt_tokens"] == len(smol_prompt_ids[0])


def test_smollm2_streaming_equals_non_streaming(smol_engine, smol_reference):
    chunks = list(smol_engine.generate(PROMPTS[3], greedy_params(NEW_TOKENS), stream=True))
    assert len(chunks) > 1
    assert chunks[-1]["output_ids"] == smol_reference[3]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    lengths = [len(c["output_ids"]) for c in chunks]
    assert lengths == sorted(lengths)


def test_smollm2_stops_at_eos_like_transformers(smol_engine, smol_hf, smol_prompt_ids):
    """Without ignore_eos both stop after the model's end-of-turn token, which is returned."""
    ids = smol_prompt_ids[0]  # "The capital of France is" -> " Paris.\n\n ... <|im_end|>" within 64 tokens
    ref = hf_greedy(smol_hf, [ids], 64, ignore_eos=False)[0]
    out = smol_engine.generate(input_ids=ids, sampling_params=greedy_params(64, ignore_eos=False))
    assert out["output_ids"] == ref
    assert len(ref) < 64, "the reference should have stopped at EOS"
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


# ------------------------------------------------------------------ tiny random checkpoints
def _tiny_prompts(vocab: int, seed: int):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (1, 3, 7, 12, 20, 33, 47, 64)]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_model(request, tmp_path_factory):
    arch = request.param
    d = make_tiny_hf_model(arch, str(tmp_path_factory.mktemp(f"tiny_{arch}")), seed=len(arch))
    hf = load_hf_model(d)
    prompts = _tiny_prompts(hf.config.vocab_size, seed=len(arch))
    return arch, d, hf, prompts


@torch.no_grad()
def _hf_logprobs(hf, prompt, tokens):
    """Log-probabilities of `tokens` following `prompt` under the reference model (one forward)."""
    x = torch.tensor([prompt + tokens])
    logp = torch.log_softmax(hf(x).logits[0].float(), -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
    return logp[pos, torch.tensor(tokens)]


def test_tiny_model_greedy_matches_transformers(tiny_model):
    arch, d, hf, prompts = tiny_model
    ref = hf_greedy(hf, prompts, NEW_TOKENS)
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=4096)
    assert type(sched.model_runner.model).__name__ == hf.config.architectures[0]
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS), return_logprob=True)
    for prompt, out, r in zip(prompts, outs, ref):
        assert out.output_ids == r, f"{arch} prompt of {len(prompt)} tokens"
        assert out.prompt_tokens == len(prompt) and out.completion_tokens == NEW_TOKENS
        expected = _hf_logprobs(hf, prompt, r)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4), arch
    # Not degenerate: different prompts, different continuations, more than one distinct token each.
    assert len({tuple(r) for r in ref}) == len(prompts)
    assert all(len(set(r)) > 2 for r in ref)
