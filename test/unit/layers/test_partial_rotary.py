"""Partial rotary (GLM-4.5's partial_rotary_factor): only each head's first rotary_dim values rotate. The torch path
equals transformers' own apply_rotary_pos_emb with its Glm4MoeRotaryEmbedding tables; the triton kernel (GPU, or
the interpreter on the CPU) equals the torch path, with the fused K/V store writing the whole head (rotated part
and pass-through part) to the pool; with the per-head q/k RMSNorm (Qwen3's, GLM-4.5's) inside the same kernel, for
whole and partial rotary."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=8, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import pytest
import torch
from transformers import Glm4MoeConfig

from sglang.srt.layers import fused_elementwise as fe
from sglang.srt.layers.rotary_embedding import FusedSetKVBufferArg, RotaryEmbedding, rotary_dim
from sglang.test.gpu_utils import triton_test_devices

HEAD_DIM, HQ, HK = 32, 4, 2


def _config(factor: float = 0.5) -> Glm4MoeConfig:
    return Glm4MoeConfig(
        hidden_size=128,
        head_dim=HEAD_DIM,
        num_attention_heads=HQ,
        num_key_value_heads=HK,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor},
    )


def _tol(dtype):
    return dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def test_rotary_dim_from_the_config():
    assert rotary_dim(_config(0.5), HEAD_DIM) == 16
    assert rotary_dim(_config(1.0), HEAD_DIM) == HEAD_DIM
    legacy = Glm4MoeConfig.from_dict({"head_dim": 128, "partial_rotary_factor": 0.5, "rope_theta": 1e6})
    assert rotary_dim(legacy, 128) == 64  # a config.json of transformers 4 (the factor at the top level)


@pytest.mark.parametrize("factor", [0.5, 0.25])
def test_torch_path_equals_transformers(factor):
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding, apply_rotary_pos_emb

    config = _config(factor)
    rotary = rotary_dim(config, HEAD_DIM)
    rope = RotaryEmbedding(config, HEAD_DIM, 64, torch.float32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(7, HQ * HEAD_DIM, generator=g), torch.randn(7, HK * HEAD_DIM, generator=g)
    pos = torch.tensor([0, 1, 5, 9, 33, 2, 63])
    got_q, got_k = rope(pos, q, k)
    cos, sin = Glm4MoeRotaryEmbedding(config)(q, pos[None])
    want_q, want_k = apply_rotary_pos_emb(
        q.view(1, 7, HQ, HEAD_DIM).transpose(1, 2), k.view(1, 7, HK, HEAD_DIM).transpose(1, 2), cos, sin
    )
    torch.testing.assert_close(got_q, want_q.transpose(1, 2).reshape(7, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(got_k, want_k.transpose(1, 2).reshape(7, -1), rtol=0, atol=1e-6)
    # The pass-through values are the input's, bit for bit; the rotated ones moved.
    heads = got_q.view(7, HQ, HEAD_DIM)
    assert torch.equal(heads[..., rotary:], q.view(7, HQ, HEAD_DIM)[..., rotary:])
    assert not torch.allclose(heads[1:, :, :rotary], q.view(7, HQ, HEAD_DIM)[1:, :, :rotary])


@pytest.mark.parametrize("device", triton_test_devices())
@pytest.mark.parametrize("store", [False, True], ids=["rotate", "rotate+store"])
def test_kernel_equals_torch_path(device, store):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = _config(0.5)
    rotary = rotary_dim(config, HEAD_DIM)
    with torch.device(device):
        rope = RotaryEmbedding(config, HEAD_DIM, 64, dtype)
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(5, (HQ + 2 * HK) * HEAD_DIM, generator=g).to(device, dtype)
    q, k, v = qkv[:, : HQ * HEAD_DIM], qkv[:, HQ * HEAD_DIM : (HQ + HK) * HEAD_DIM], qkv[:, (HQ + HK) * HEAD_DIM :]
    pos = torch.tensor([3, 0, 17, 63, 8], device=device)
    loc = torch.tensor([9, 2, 11, 4, 6], device=device)
    reference = RotaryEmbedding(config, HEAD_DIM, 64, torch.float32)
    want_q, want_k = reference(pos.cpu(), q.float().cpu(), k.float().cpu())
    want_v = v.float().cpu().clone()
    k_buf = torch.zeros(12, HK, HEAD_DIM, dtype=dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    arg = FusedSetKVBufferArg(value=v, k_buffer=k_buf, v_buffer=v_buf, cache_loc=loc) if store else None
    fe.apply_rotary_inplace(pos, q, k, rope.cos_cache, rope.sin_cache, HEAD_DIM, kv_store=arg, rotary_dim=rotary)
    torch.testing.assert_close(q.float().cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(k.float().cpu(), want_k, **_tol(dtype))
    if store:  # the whole K row (pass-through values too) and V in their slots, nothing elsewhere
        torch.testing.assert_close(k_buf[loc].float().cpu().view(5, -1), want_k, **_tol(dtype))
        assert torch.equal(v_buf[loc].float().cpu().view(5, -1), want_v)
        untouched = torch.ones(12, dtype=torch.bool)
        untouched[loc.cpu()] = False
        assert (k_buf[untouched.to(device)] == 0).all() and (v_buf[untouched.to(device)] == 0).all()


@pytest.mark.parametrize("device", triton_test_devices())
@pytest.mark.parametrize("factor", [1.0, 0.5], ids=["full-rotary", "partial-rotary"])
@pytest.mark.parametrize("store", [False, True], ids=["rotate", "rotate+store"])
@pytest.mark.parametrize("unit_offset", [False, True], ids=["llama-norm", "gemma-norm"])
def test_rotary_with_the_per_head_qk_norm(device, factor, store, unit_offset):
    """Qwen3's / GLM-4.5's per-head q/k RMSNorm (and Gemma 3's, whose scale is (1 + w) and rounds once) inside the
    rotary kernel, in place on the strided views of qkv: equal to the norm (in the activation dtype) then rotary, for
    whole and partial rotary (the unrotated tail normed too), with and without the K/V store; V and the rest of qkv
    untouched."""
    from sglang.srt.layers.layernorm import gemma_rms_normed, rms_normed
    from sglang.srt.layers.rotary_embedding import QKNorm

    rms_normed = gemma_rms_normed if unit_offset else rms_normed  # noqa: F811  (the family's norm, reference side)

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    hq, hk, d = HQ, HK, HEAD_DIM
    config = _config(factor)
    with torch.device(device):
        rope = RotaryEmbedding(config, d, 64, dtype)
    g = torch.Generator().manual_seed(7)
    qkv = (4 * torch.randn(5, (hq + 2 * hk) * d, generator=g)).to(device, dtype)  # rms far from 1: the norm acts
    norm = QKNorm(
        (1 + torch.randn(d, generator=g)).to(device, dtype),
        torch.rand(d, generator=g).to(device, dtype),
        1e-6,
        unit_offset=unit_offset,
    )
    q, k, v = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d], qkv[:, (hq + hk) * d :]
    original_q = q.float().cpu().clone()
    pos = torch.tensor([3, 0, 17, 63, 8], device=device)
    loc = torch.tensor([9, 2, 11, 4, 6], device=device)
    normed_q = rms_normed(q.reshape(5, hq, d), norm.q_weight, norm.eps).reshape(5, -1)
    normed_k = rms_normed(k.reshape(5, hk, d), norm.k_weight, norm.eps).reshape(5, -1)
    reference = RotaryEmbedding(config, d, 64, torch.float32)
    want_q, want_k = reference(pos.cpu(), normed_q.float().cpu(), normed_k.float().cpu())
    want_v = v.float().cpu().clone()
    k_buf = torch.zeros(12, hk, d, dtype=dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    arg = FusedSetKVBufferArg(value=v, k_buffer=k_buf, v_buffer=v_buf, cache_loc=loc) if store else None
    kernel_qkv = qkv.clone()
    kq, kk = kernel_qkv[:, : hq * d], kernel_qkv[:, hq * d : (hq + hk) * d]
    fe.apply_rotary_inplace(
        pos, kq, kk, rope.cos_cache, rope.sin_cache, d, kv_store=arg, rotary_dim=rope.rotary_dim, qk_norm=norm
    )
    torch.testing.assert_close(kq.float().cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(kk.float().cpu(), want_k, **_tol(dtype))
    assert torch.equal(kernel_qkv[:, (hq + hk) * d :], v)
    if store:
        torch.testing.assert_close(k_buf[loc].float().cpu().view(5, -1), want_k, **_tol(dtype))
        assert torch.equal(v_buf[loc].float().cpu().view(5, -1), want_v)
    # The layer's path (RotaryEmbedding.forward; torch on the CPU) gives the same rows.
    got_q, got_k = rope(pos, q, k, qk_norm=norm)
    torch.testing.assert_close(got_q.float().cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(got_k.float().cpu(), want_k, **_tol(dtype))
    assert not torch.allclose(normed_q.float().cpu(), original_q, atol=0.5)  # the norm is not the identity here
