"""layers/rotary_embedding.py against transformers' own rotary embeddings, for every rope type ModelConfig lets
through (configs/rope.py:EXACT_ROPE_TYPES) and for Phi-3's partial rotary: the rotated q and k equal
transformers' (its RotaryEmbedding module, then its apply_rotary_pos_emb) at positions across the served context;
on the GPU the triton kernel (in place, and storing K/V to the pool) equals the CPU path, including a head of 96
(Phi-3-mini: half a head is not a power of two) and a partially rotated head of 128 (Phi-4-mini)."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=6, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.rope import EXACT_ROPE_TYPES
from sglang.srt.layers.rotary_embedding import FusedSetKVBufferArg, RotaryEmbedding

MAX_POS = 256
SCALED = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


def _llama(rope_type: str):
    from transformers import LlamaConfig

    params = {"rope_type": "default", **SCALED.get(rope_type, {}), "rope_theta": 10000.0}
    return LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        rope_parameters=params,
        architectures=["LlamaForCausalLM"],
    )


def _phi3(rope_type: str, head_dim: int = 32, partial: float = 0.75):
    from transformers import Phi3Config

    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    half = int(head_dim * partial) // 2
    if rope_type == "longrope":
        g = torch.Generator().manual_seed(0)
        params.update(
            rope_type="longrope",
            short_factor=(1 + 3 * torch.rand(half, generator=g)).tolist(),
            long_factor=(4 + 8 * torch.rand(half, generator=g)).tolist(),
        )
    return Phi3Config(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        original_max_position_embeddings=MAX_POS // 4,
        rope_parameters=params,
        architectures=["Phi3ForCausalLM"],
    )


def _reference(config, q, k, positions):
    """transformers: the family's RotaryEmbedding (its dynamic/longrope update included) and apply_rotary_pos_emb,
    over one sequence of len(positions) tokens."""
    import importlib

    family = "phi3" if config.model_type == "phi3" else "llama"
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    rope = getattr(mod, f"{'Phi3' if family == 'phi3' else 'Llama'}RotaryEmbedding")(config)
    d = q.shape[-1] // config.num_attention_heads
    qs = q.view(1, -1, config.num_attention_heads, d).transpose(1, 2)
    ks = k.view(1, -1, config.num_key_value_heads, d).transpose(1, 2)
    cos, sin = rope(qs, positions[None])
    q2, k2 = mod.apply_rotary_pos_emb(qs, ks, cos, sin)
    return q2.transpose(1, 2).reshape(q.shape), k2.transpose(1, 2).reshape(k.shape)


CASES = [("llama", t) for t in ("default", *SCALED)] + [("phi3", "default"), ("phi3", "longrope")]


def test_every_exact_rope_type_is_covered():
    assert {t for _, t in CASES} == set(EXACT_ROPE_TYPES)


@pytest.mark.parametrize("family,rope_type", CASES)
def test_rotary_matches_transformers(family, rope_type):
    config = _llama(rope_type) if family == "llama" else _phi3(rope_type)
    context = ModelConfig.from_hf_config(config).context_len  # longrope: original_max_position_embeddings
    d = 32
    rope = RotaryEmbedding(config, d, config.max_position_embeddings, torch.float32)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(context, 4 * d, generator=g), torch.randn(context, 2 * d, generator=g)
    positions = torch.arange(context)
    want_q, want_k = _reference(config, q, k, positions)
    got_q, got_k = rope(positions, q.clone(), k.clone())
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)
    if family == "phi3":  # the unrotated quarter of each head passes through untouched
        assert torch.equal(got_k.view(context, 2, d)[..., 24:], k.view(context, 2, d)[..., 24:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
@pytest.mark.parametrize("head_dim,partial", [(96, 1.0), (128, 0.75), (64, 0.5)])
@pytest.mark.parametrize("store_kv", [False, True])
def test_gpu_kernel_partial_and_odd_heads(head_dim, partial, store_kv):
    config = _phi3("longrope" if partial < 1 else "default", head_dim=head_dim, partial=partial)
    dev, dtype = "cuda", torch.bfloat16
    with torch.device(dev):
        rope = RotaryEmbedding(config, head_dim, MAX_POS, dtype)
    rope_cpu = RotaryEmbedding(config, head_dim, MAX_POS, torch.float32)
    g = torch.Generator().manual_seed(2)
    n = 9
    qkv = torch.randn(n, 8 * head_dim, generator=g).to(dev, dtype)
    q, k, v = qkv[:, : 4 * head_dim], qkv[:, 4 * head_dim : 6 * head_dim], qkv[:, 6 * head_dim :]
    pos = torch.tensor([0, 1, 5, 9, 33, 2, 63, 17, 40], device=dev)
    want_q, want_k = rope_cpu(pos.cpu(), q.float().cpu(), k.float().cpu())
    arg = None
    if store_kv:
        loc = torch.tensor([3, 0, 12, 7, 1, 9, 5, 11, 2], device=dev)
        k_buf = torch.zeros(13, 2, head_dim, dtype=dtype, device=dev)
        arg = FusedSetKVBufferArg(value=v, k_buffer=k_buf, v_buffer=torch.zeros_like(k_buf), cache_loc=loc)
    q, k = rope(pos, q, k, fused_set_kv_buffer_arg=arg)
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(q.float().cpu(), want_q, **tol)
    torch.testing.assert_close(k.float().cpu(), want_k, **tol)
    if store_kv:
        torch.testing.assert_close(arg.k_buffer[loc].float().cpu().view(n, -1), want_k, **tol)
        assert torch.equal(arg.v_buffer[loc].view(n, -1), v)
