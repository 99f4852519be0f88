from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# --quantization fp8 on tiny random Llama / Qwen2 checkpoints (CPU, fp32 activations): the decoder's linear
# layers hold float8_e4m3fn weights with one scale per output row, quantized while loading, and greedy
# generation equals transformers' model with every decoder linear replaced by the same fake quantization
# (weights per output row, activations per token, to e4m3 and back) token for token, log-probabilities
# nearly so.

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.quantization.fp8_linear import FP8_DTYPE, quantize_rows
from sglang.test.runners import (
    greedy_params,
    hf_greedy,
    load_hf_model,
    make_scheduler,
    make_tiny_hf_model,
    run_scheduler,
)

NEW_TOKENS = 24


class FakeQuantLinear(nn.Module):
    """An nn.Linear that computes with e4m3-rounded weights (per output row) and inputs (per token)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        qweight, scale = quantize_rows(linear.weight.data)
        self.weight = qweight.float() * scale
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qx, sx = quantize_rows(x.reshape(-1, x.shape[-1]))
        return F.linear((qx.float() * sx).view(x.shape), self.weight, self.bias)


def fake_quantized(hf: nn.Module) -> nn.Module:
    for layer in hf.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, FakeQuantLinear(child))
    return hf


@torch.no_grad()
def _logprobs(hf, prompt, tokens):
    logp = torch.log_softmax(hf(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
    return logp[pos, torch.tensor(tokens)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: the qkv projection has a bias
def test_fp8_engine_equals_fake_quantized_transformers(arch, tmp_path):
    d = make_tiny_hf_model(arch, str(tmp_path / arch), seed=3)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 5, 17, 40)]
    ref_model = fake_quantized(load_hf_model(d))
    ref = hf_greedy(ref_model, prompts, NEW_TOKENS)

    sched = make_scheduler(
        reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, quantization="fp8"
    )
    linears = [m for m in sched.model_runner.model.modules() if isinstance(m, LinearBase)]
    assert len(linears) == 4 * len(ref_model.model.layers)
    assert all(m.weight.dtype == FP8_DTYPE and m.weight_scale.shape == (m.weight.shape[0], 1) for m in linears)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS), return_logprob=True)

    plain = load_hf_model(d)
    ours, fake, unquantized = [], [], []
    for prompt, out, r in zip(prompts, outs, ref):
        assert out.output_ids == r, f"{arch}, prompt of {len(prompt)} tokens"
        ours.append(torch.tensor(out.logprobs))
        fake.append(_logprobs(ref_model, prompt, r))
        unquantized.append(_logprobs(plain, prompt, r))
    ours, fake, unquantized = torch.cat(ours), torch.cat(fake), torch.cat(unquantized)
    # fp8 rounding is a step function: a last-bit difference of fp32 arithmetic (our fused kernels vs
    # transformers' ops) can move a value across a rounding boundary, and then the later positions of that
    # sequence differ by ~1e-2. So: most positions equal, and on average far closer to the fake-quantized
    # reference than fp8 is to the unquantized model.
    diff = (ours - fake).abs()
    assert diff.median().item() <= 1e-4, diff
    assert diff.mean().item() < 0.2 * (fake - unquantized).abs().mean().item()
    assert (ours - unquantized).abs().median().item() > 1e-3  # the reference is not the unquantized model
    assert len({tuple(r) for r in ref}) == len(prompts)
