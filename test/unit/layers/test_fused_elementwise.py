"""The fused triton RMSNorm / rotary / SiLU-and-mul / GELU(tanh)-and-mul kernels equal the torch layers they replace on the GPU
(CPU: through the triton interpreter)."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")
register_cuda_ci(est_time=20, suite="per-commit-cuda")

import pytest
import torch
from transformers import LlamaConfig

from sglang.srt.layers import fused_elementwise as fe
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.quantization.block_fp8_activation import ActivationLayout
from sglang.srt.layers.rotary_embedding import FusedSetKVBufferArg, RotaryEmbedding
from sglang.test.gpu_utils import triton_test_devices

DEVICES = triton_test_devices()


def _tol(dtype):
    return dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_rmsnorm_with_and_without_residual(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, eps=1e-6).to(device, dtype)
    norm.weight.data = torch.randn(96, generator=g).to(device, dtype)
    x = torch.randn(5, 96, generator=g).to(device, dtype)
    res = torch.randn(5, 96, generator=g).to(device, dtype)
    torch.testing.assert_close(fe.rmsnorm(x, norm.weight, 1e-6), norm._norm(x), **_tol(dtype))
    want_res = x + res
    want = norm._norm(want_res)
    res_copy = res.clone()
    got = fe.rmsnorm(x.clone(), norm.weight, 1e-6, residual=res_copy)
    torch.testing.assert_close(res_copy, want_res, **_tol(dtype))
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_gemma_rmsnorm_and_its_sandwich_equal_the_torch_ops(device):
    """Gemma's (1 + w) RMSNorm, rounded once, as one kernel: alone, and as the sandwich between two blocks (the
    residual stream += post_norm(block output) in place, the result next_norm(stream)), against the torch ops the
    CPU runs (transformers' bits); a Llama-rounded norm of the same rows differs, so the rounding is checked."""
    from sglang.srt.layers.layernorm import GemmaRMSNorm, gemma_rms_normed, rms_normed, sandwich_norms

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(3)
    post, following = GemmaRMSNorm(160, eps=1e-6), GemmaRMSNorm(160, eps=1e-5)
    for norm in (post, following):
        norm.weight.data = torch.randn(160, generator=g)
        norm.to(device, dtype)
    x = (3 * torch.randn(6, 160, generator=g)).to(device, dtype)
    res = torch.randn(6, 160, generator=g).to(device, dtype)
    want = gemma_rms_normed(x, following.weight, 1e-5)
    torch.testing.assert_close(fe.gemma_rmsnorm(x, following.weight, 1e-5), want, **_tol(dtype))
    torch.testing.assert_close(following(x), want, **_tol(dtype))
    want_res = res + gemma_rms_normed(x, post.weight, 1e-6)
    want_out = gemma_rms_normed(want_res, following.weight, 1e-5)
    res_copy = res.clone()
    got = fe.gemma_rmsnorm(x, following.weight, 1e-5, sandwich=(res_copy, post.weight, 1e-6))
    torch.testing.assert_close(res_copy, want_res, **_tol(dtype))
    torch.testing.assert_close(got, want_out, **_tol(dtype))
    got_out, got_res = sandwich_norms(x, res.clone(), post, following)  # the layer's entry point, either device
    torch.testing.assert_close(got_res, want_res, **_tol(dtype))
    torch.testing.assert_close(got_out, want_out, **_tol(dtype))
    assert not torch.allclose(want.float(), rms_normed(x, following.weight, 1e-5).float(), atol=0.1)
    with pytest.raises(ValueError, match="residual stream"):
        fe.gemma_rmsnorm(x, following.weight, 1e-5, sandwich=(res[:3], post.weight, 1e-6))


def test_rotary_refuses_the_qk_norm_with_interleaved_pairs():
    from sglang.srt.layers.rotary_embedding import QKNorm

    x = torch.zeros(1, 16)
    with pytest.raises(ValueError, match="interleaved"):
        fe.apply_rotary_inplace(
            torch.zeros(1, dtype=torch.long), x, x, x, x, 16, interleaved=True, qk_norm=QKNorm(x[0], x[0], 1e-6)
        )


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_inplace_matches_reference(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with torch.device(device):
        rope = RotaryEmbedding(config, 64, 64, dtype)
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(7, (4 + 2 + 2) * 64, generator=g).to(device, dtype)
    q, k = qkv[:, :256], qkv[:, 256:384]
    pos = torch.tensor([0, 1, 5, 9, 33, 2, 63], device=device)
    rope_cpu = RotaryEmbedding(config, 64, 64, torch.float32)
    want_q, want_k = rope_cpu(pos.cpu(), q.float().cpu(), k.float().cpu())
    fe.apply_rotary_inplace(pos, q, k, rope.cos_cache, rope.sin_cache, 64)
    torch.testing.assert_close(q.float().cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(k.float().cpu(), want_k, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_rotary_inplace_on_strided_head_views(device):
    """DeepSeek's rotary (interleaved pairs, the result de-interleaved) in place on [T, H, rope] views inside each
    head's row of q and on the rope columns of kv_a's rows: equal to RotaryEmbedding's torch path, the other
    columns untouched."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64)
    with torch.device(device):
        rope = RotaryEmbedding(config, 16, 64, dtype, interleaved=True)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(5, 3, 24 + 16, generator=g).to(device, dtype)  # [T, H, nope + rope]
    kv_a = torch.randn(5, 32 + 16, generator=g).to(device, dtype)  # [T, kv_lora + rope]
    q_rope, k_rope = q[..., 24:], kv_a[:, 32:]
    pos = torch.tensor([0, 7, 63, 2, 31], device=device)
    ref = RotaryEmbedding(config, 16, 64, torch.float32, interleaved=True)
    want_q, want_k = ref(pos.cpu(), q_rope.float().cpu().reshape(5, -1), k_rope.float().cpu())
    q_nope, latent, before = q[..., :24].clone(), kv_a[:, :32].clone(), q_rope.float().cpu().reshape(5, -1)
    fe.apply_rotary_inplace(pos, q_rope, k_rope, rope.cos_cache, rope.sin_cache, 16, interleaved=True)
    torch.testing.assert_close(q_rope.float().cpu().reshape(5, -1), want_q, **_tol(dtype))
    torch.testing.assert_close(k_rope.float().cpu(), want_k, **_tol(dtype))
    assert torch.equal(q[..., :24], q_nope) and torch.equal(kv_a[:, :32], latent)
    assert not torch.allclose(before, want_q)  # positions > 0 rotate: the comparison above is not vacuous


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens", [5, 70])  # 70: two token blocks of the absorption's tiles
def test_rotary_also_runs_the_query_absorption(device, tokens):
    """MLA's q_nope through W_UK as extra programs of DeepSeek's rotary launch (query_absorb): the product equals
    head_matmul's own launch bit for bit (the same tiles), the rotation, the latent and q_nope are as without it.
    3 heads x 2 column blocks (40 columns, one partial) x the token blocks: every tile index decomposed."""
    from sglang.srt.layers.attention.triton_ops.head_matmul import HeadMatmul, head_matmul

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128)
    with torch.device(device):
        rope = RotaryEmbedding(config, 16, 128, dtype, interleaved=True)
    g = torch.Generator().manual_seed(tokens)
    q = torch.randn(tokens, 3, 24 + 16, generator=g).to(device, dtype)
    kv_a = torch.randn(tokens, 32 + 16, generator=g).to(device, dtype)
    w_kv_b = (0.2 * torch.randn(3, 24, 40, generator=g)).to(device, dtype)
    w_uk = w_kv_b.transpose(1, 2).contiguous().transpose(1, 2)  # [H, K, N] read across rows, as kv_b_proj's view is
    pos = torch.randint(0, 128, (tokens,), generator=g).to(device)
    q2, kv_a2 = q.clone(), kv_a.clone()
    fe.apply_rotary_inplace(pos, q2[..., 24:], kv_a2[:, 32:], rope.cos_cache, rope.sin_cache, 16, interleaved=True)
    absorb = HeadMatmul(q[..., :24], w_uk, torch.full((tokens, 3, 40), 9.0, dtype=dtype, device=device))
    fe.apply_rotary_inplace(
        pos, q[..., 24:], kv_a[:, 32:], rope.cos_cache, rope.sin_cache, 16, interleaved=True, query_absorb=absorb
    )
    assert torch.equal(q, q2) and torch.equal(kv_a, kv_a2)
    assert torch.equal(absorb.out, head_matmul(q[..., :24], w_uk))
    ref = torch.einsum("thk,hkn->thn", q[..., :24].double(), w_uk.double())
    torch.testing.assert_close(absorb.out.double(), ref, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "layer"])
def test_rotary_with_fused_kv_store(device, use_kernel):
    """Rotary with a FusedSetKVBufferArg rotates q/k in place and writes rotated K and V to the pool
    slots (kernel directly, and through RotaryEmbedding.forward, whose CPU path stores with torch)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with torch.device(device):
        rope = RotaryEmbedding(config, 64, 64, dtype)
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(5, (4 + 2 + 2) * 64, generator=g).to(device, dtype)
    q, k, v = qkv[:, :256], qkv[:, 256:384], qkv[:, 384:]
    pos = torch.tensor([3, 0, 17, 63, 8], device=device)
    loc = torch.tensor([9, 2, 11, 4, 6], device=device)
    want_q, want_k = RotaryEmbedding(config, 64, 64, torch.float32)(pos.cpu(), q.float().cpu(), k.float().cpu())
    want_v = v.float().cpu().clone()
    k_buf = torch.zeros(12, 2, 64, dtype=dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    arg = FusedSetKVBufferArg(value=v, k_buffer=k_buf, v_buffer=v_buf, cache_loc=loc)
    if use_kernel:
        fe.apply_rotary_inplace(pos, q, k, rope.cos_cache, rope.sin_cache, 64, kv_store=arg)
    else:
        q, k = rope(pos, q, k, fused_set_kv_buffer_arg=arg)
    torch.testing.assert_close(q.float().cpu(), want_q, **_tol(dtype))
    torch.testing.assert_close(k.float().cpu(), want_k, **_tol(dtype))
    torch.testing.assert_close(k_buf[loc].float().cpu().view(5, -1), want_k, **_tol(dtype))
    assert torch.equal(v_buf[loc].float().cpu().view(5, -1), want_v)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[loc.cpu()] = False
    assert (k_buf[untouched.to(device)] == 0).all() and (v_buf[untouched.to(device)] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_silu_and_mul(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x = torch.randn(6, 2 * 80, generator=torch.Generator().manual_seed(3)).to(device, dtype)
    want = torch.nn.functional.silu(x[:, :80].float()) * x[:, 80:].float()
    torch.testing.assert_close(fe.silu_and_mul(x).float(), want, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [80, 2048 + 384])  # one program a row; two, the second ragged
def test_gelu_tanh_and_mul_is_torchs_two_ops(device, d):
    """Gemma's GeGLU in one kernel against F.gelu(gate, approximate="tanh") * up in the same dtype: torch's rounding
    points (the gelu, then the product), values past the tanh's saturation included. On the GPU (bf16) the kernel's
    tanh is libdevice's, the CUDA math library's tanhf that torch's kernel calls, and the rest is torch's fp32
    arithmetic in torch's order, so the bits match torch's nearly everywhere (> 99%; the tolerance still allows one
    unit in the last place, or 1e-5). The interpreter (fp32) has no libdevice: its tanh is triton_math's formula,
    which may differ in the last bit, and both lose ~1e-7 to the cancellation in 1 + tanh for negative gates: within
    1e-5."""
    import torch.nn.functional as F

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x = (torch.randn(6, 2 * d, generator=torch.Generator().manual_seed(d)) * 4).to(device, dtype)
    x[0, :4] = torch.tensor([0.0, -30.0, 30.0, 1e-3])  # gate: zero, saturated both ways, tiny
    want = F.gelu(x[:, :d], approximate="tanh") * x[:, d:]
    got = fe.gelu_tanh_and_mul(x)
    assert got.dtype == dtype and got.shape == (6, d)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=1e-5)
        assert (got == want).float().mean().item() > 0.99


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "layer"])
def test_rotary_norms_and_stores_latent_rows_in_the_mla_pool(device, use_kernel):
    """DeepSeek's decode layer: rotary (interleaved) rotates q's and kv_a's rope columns, RMS-norms the latent
    columns in place (kv_a_layernorm) and writes each token's latent row and rotated key into the MLA pool through
    MLATokenToKVPool.fused_store_buffers: the same bits as the norm kernel, the unfused rotary and set_mla_kv_buffer
    (on the CPU's torch path: as the torch norm), and no other slot touched."""
    from sglang.srt.layers.layernorm import rms_normed
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    kv_lora, rope_dim, heads, eps = 32, 16, 3, 1e-6
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64)
    with torch.device(device):
        rope = RotaryEmbedding(config, rope_dim, 64, dtype, interleaved=True)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(5, heads, 24 + rope_dim, generator=g).to(device, dtype)
    kv_a = (torch.randn(5, kv_lora + rope_dim, generator=g) * 3).to(device, dtype)  # latent (raw) | k_rope
    norm_weight = (torch.rand(kv_lora, generator=g) + 0.5).to(device, dtype)
    pos = torch.tensor([0, 7, 63, 2, 31], device=device)
    loc = torch.tensor([9, 2, 11, 4, 6], device=device)

    def pool():
        p = MLATokenToKVPool(12, 1, dtype, kv_lora, rope_dim, layer_num=2, device=device)
        for buf in p.kv_buffer:
            buf.zero_()
        return p

    want_q, want_kv_a, ref, raw_latent = q.clone(), kv_a.clone(), pool(), kv_a[:, :kv_lora].clone()
    if use_kernel or device != "cpu":
        want_kv_a[:, :kv_lora] = fe.rmsnorm(want_kv_a[:, :kv_lora], norm_weight, eps)
    else:
        want_kv_a[:, :kv_lora] = rms_normed(want_kv_a[:, :kv_lora], norm_weight, eps)
    fe.apply_rotary_inplace(pos, want_q[..., 24:], want_kv_a[:, kv_lora:], rope.cos_cache, rope.sin_cache, rope_dim,
                            interleaved=True)  # fmt: skip
    ref.set_mla_kv_buffer(1, loc, want_kv_a[:, :kv_lora], want_kv_a[:, kv_lora:])

    ours = pool()
    latent, k_rope = kv_a[:, :kv_lora], kv_a[:, kv_lora:]
    rope_cols, latent_cols = ours.fused_store_buffers(1, k_rope, latent)
    arg = FusedSetKVBufferArg(
        value=latent, k_buffer=rope_cols, v_buffer=latent_cols, cache_loc=loc, value_norm=(norm_weight, eps)
    )
    if use_kernel:
        fe.apply_rotary_inplace(pos, q[..., 24:], k_rope, rope.cos_cache, rope.sin_cache, rope_dim, kv_store=arg,
                                interleaved=True)  # fmt: skip
        q_rope, k_rope = q[..., 24:], kv_a[:, kv_lora:]
    else:  # in place on the GPU; the CPU's torch path returns new tensors (the latent is normed in place on both)
        q_rope, k_rope = rope(pos, q[..., 24:], k_rope, fused_set_kv_buffer_arg=arg)
    assert torch.equal(q_rope, want_q[..., 24:]) and torch.equal(k_rope, want_kv_a[:, kv_lora:])
    assert torch.equal(kv_a[:, :kv_lora], want_kv_a[:, :kv_lora])  # the latent, normed in place
    assert torch.equal(ours.kv_buffer[1], ref.kv_buffer[1]) and (ours.kv_buffer[0] == 0).all()
    assert (ref.kv_buffer[1][loc].abs().sum(-1) > 0).all()  # the rows were written: the comparison is not vacuous
    assert not torch.allclose(want_kv_a[:, :kv_lora], raw_latent)  # the norm changes the rows: not vacuous either
    # an fp8 cache stores through set_mla_kv_buffer (the conversion): no fused store
    fp8 = MLATokenToKVPool(12, 1, torch.float8_e4m3fn, kv_lora, rope_dim, layer_num=1, device=device)
    assert fp8.fused_store_buffers(0, k_rope, latent) is None


LAYOUTS = [
    pytest.param(ActivationLayout(), id="row-major"),
    pytest.param(ActivationLayout(pad_rows_to=4, column_major_scales=True), id="cublas"),
]


def _assert_same_activation(got, x_unfused, layout):
    """``got`` (a kernel's own quantized output) has the bits of ``x_unfused`` through the quantization kernel in
    the same layout, padding rows included (zero codes, the smallest scale)."""
    from sglang.srt.layers.quantization.fp8_block_kernels import quantize_groups

    q, scale = quantize_groups(x_unfused, layout.pad_rows_to, layout.column_major_scales)
    assert got.rows == x_unfused.shape[0] and got.dtype == x_unfused.dtype and got.layout == layout
    assert got.q.shape == q.shape and got.scale.shape == scale.shape and got.scale.stride() == scale.stride()
    assert torch.equal(got.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(got.scale, scale)
    assert got.q.shape[0] > got.rows or layout.pad_rows_to == 1  # 5 rows: padded to 8 in cuBLAS's layout
    assert not got.q[got.rows :].float().any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_hands_a_block_fp8_projection_its_output_quantized(device, layout, with_residual):
    """RMSNorm with ``quantize``: the norm's output per token and 128-column group (a ragged last group here) in
    the projection's layout, the same bits as the norm kernel's output through the quantization kernel, and the
    residual updated as before; no output written in x's dtype (x untouched)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(40 + with_residual)
    x = (torch.randn(5, 320, generator=g) * 4).to(device, dtype)
    x[1, 130:140] *= 300  # one group's range far above the others'
    weight = (torch.rand(320, generator=g) + 0.5).to(device, dtype)
    residual = torch.randn(5, 320, generator=g).to(device, dtype) if with_residual else None
    x_before = x.clone()
    want_residual = residual.clone() if with_residual else None
    want = fe.rmsnorm(x.clone(), weight, 1e-6, residual=want_residual)
    got_residual = residual.clone() if with_residual else None
    got = fe.rmsnorm(x, weight, 1e-6, residual=got_residual, quantize=layout)
    _assert_same_activation(got, want, layout)
    assert torch.equal(x, x_before)
    if with_residual:
        assert torch.equal(got_residual, want_residual)
    with pytest.raises(ValueError, match="2-D x"):
        fe.rmsnorm(x.view(5, 2, 160), weight[:160], 1e-6, quantize=layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d", [320, 2048 + 384])  # one program a row; two, the second ragged
def test_silu_and_mul_hands_a_block_fp8_projection_its_output_quantized(device, layout, d):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x = (torch.randn(5, 2 * d, generator=torch.Generator().manual_seed(d)) * 3).to(device, dtype)
    x[2, d - 5] = 40.0  # a group of another range (the second program's, for the wider row)
    got = fe.silu_and_mul(x, quantize=layout)
    _assert_same_activation(got, fe.silu_and_mul(x), layout)
