"""MHATokenToKVPool and MLATokenToKVPool hold memory only (the allocator counts tokens); fp8 KV is stored as
bytes by one rule."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

import pytest
import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, kv_storage_dtype


@pytest.mark.parametrize(
    "dtype,stored",
    [
        (torch.float8_e4m3fn, torch.uint8),
        (torch.float8_e5m2, torch.uint8),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
    ],
)
def test_one_storage_rule(dtype, stored):
    assert kv_storage_dtype(dtype) == stored
    pool = MHATokenToKVPool(
        8, page_size=4, dtype=dtype, head_num=2, head_dim=16, v_head_dim=8, layer_num=3, device="cpu"
    )
    assert pool.store_dtype == stored and all(b.dtype == stored for b in pool.k_buffer + pool.v_buffer)
    assert pool.k_buffer[0].shape == (8 + 4, 2, 16) and pool.v_buffer[2].shape == (8 + 4, 2, 8)
    assert pool.get_key_buffer(1).dtype == dtype  # read back as the KV dtype


def test_fp8_round_trip_through_byte_storage():
    pool = MHATokenToKVPool(
        4, page_size=1, dtype=torch.float8_e4m3fn, head_num=1, head_dim=4, v_head_dim=4, layer_num=1, device="cpu"
    )
    k = torch.tensor([[[0.5, -1.0, 2.0, 0.25]]])
    pool.set_kv_buffer(0, torch.tensor([3]), k, -k)
    assert torch.equal(pool.get_key_buffer(0)[3].float(), k[0])
    assert torch.equal(pool.get_value_buffer(0)[3].float(), -k[0])


def test_fp8_store_with_checkpoint_kv_scales_holds_the_scaled_values():
    """A checkpoint's k_scale / v_scale: the cache holds k / k_scale and v / v_scale in e4m3 (saturating at
    448), which the attention backends multiply back."""
    pool = MHATokenToKVPool(
        4, page_size=1, dtype=torch.float8_e4m3fn, head_num=2, head_dim=8, v_head_dim=8, layer_num=2, device="cpu"
    )
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, 8, generator=gen) * 3, torch.randn(2, 2, 8, generator=gen) * 3
    v[0, 0, 0] = 1e4  # beyond e4m3's range after scaling: saturates instead of becoming NaN
    loc = torch.tensor([1, 3])
    pool.set_kv_buffer(1, loc, k, v, 0.02, 7.0)
    stored_k, stored_v = pool.get_key_buffer(1)[loc].float(), pool.get_value_buffer(1)[loc].float()
    assert torch.equal(stored_k, (k / 0.02).to(torch.float8_e4m3fn).float())
    assert torch.equal(stored_v, (v / 7.0).clamp(-448, 448).to(torch.float8_e4m3fn).float())
    assert stored_v[0, 0, 0] == 448.0
    assert (stored_k * 0.02 - k).abs().max() < 0.07 * k.abs().max()  # read back times the scale: K again
    pool.set_kv_buffer(0, loc, k, v)  # no scales: stored as they are
    assert torch.equal(pool.get_key_buffer(0)[loc].float(), k.to(torch.float8_e4m3fn).float())


def test_kv_scales_need_an_fp8_pool():
    pool = MHATokenToKVPool(
        4, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=4, v_head_dim=4, layer_num=1, device="cpu"
    )
    with pytest.raises(ValueError, match="fp8 KV cache"):
        pool.set_kv_buffer(0, torch.tensor([1]), torch.ones(1, 1, 4), torch.ones(1, 1, 4), 0.5, 0.5)


def test_given_buffers_must_hold_the_tokens_and_the_dummy_page():
    bufs = [torch.empty(10, 1, 4) for _ in range(2)]

    def pool(tokens: int, layers: int = 1) -> MHATokenToKVPool:
        return MHATokenToKVPool(
            tokens,
            page_size=4,
            dtype=torch.float32,
            head_num=1,
            head_dim=4,
            v_head_dim=4,
            layer_num=layers,
            device="cpu",
            buffers=bufs,
        )

    pool(6)  # 6 tokens + the 4-slot dummy page fit 10 slots
    with pytest.raises(ValueError, match="do not fit"):
        pool(7)
    with pytest.raises(ValueError, match="expected 4 KV buffers"):
        pool(4, layers=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_mla_pool_is_one_latent_row_per_token_and_layer(dtype):
    pool = MLATokenToKVPool(
        16, page_size=4, dtype=dtype, kv_lora_rank=32, qk_rope_head_dim=8, layer_num=3, device="cpu"
    )
    assert len(pool.buffers()) == 3  # one buffer per layer: no separate V
    assert all(b.shape == (16 + 4, 1, 40) and b.dtype == kv_storage_dtype(dtype) for b in pool.buffers())
    nbytes = sum(b.numel() * b.element_size() for b in pool.buffers())
    assert nbytes == (16 + 4) * 3 * 40 * dtype.itemsize  # slots x layers x (kv_lora + rope) x dtype bytes
    latent = torch.tensor([[0.5, -1.0] * 16, [2.0, 0.25] * 16])
    rope = torch.tensor([[1.5] * 8, [-0.5] * 8])
    pool.set_mla_kv_buffer(1, torch.tensor([5, 9]), latent, rope)
    k = pool.get_key_buffer(1)
    assert k.dtype == dtype and k.shape == (20, 1, 40)
    assert torch.equal(k[[5, 9], 0].float(), torch.cat([latent, rope], -1))
    v = pool.get_value_buffer(1)  # the latent part of the same rows, a view
    assert v.shape == (20, 1, 32) and v.data_ptr() == k.data_ptr() and torch.equal(v[[5, 9], 0].float(), latent)
    fused = pool.fused_store_buffers(1, rope.to(dtype), latent.to(dtype))  # rotary's store: views of the rows
    if dtype == torch.float8_e4m3fn:  # stored converted (set_mla_kv_buffer): no fused store
        assert fused is None
    else:
        assert [tuple(b.shape) for b in fused] == [(20, 8), (20, 32)]
        assert torch.equal(fused[0][[5, 9]].float(), rope) and torch.equal(fused[1][[5, 9]].float(), latent)
    assert pool.fused_store_buffers(1, rope.to(dtype).t(), latent.to(dtype)) is None  # not row-contiguous
    pool.set_kv_buffer(2, torch.tensor([3]), torch.cat([latent, rope], -1)[:1].view(1, 1, 40))  # whole rows
    assert torch.equal(pool.get_key_buffer(2)[3, 0].float(), torch.cat([latent[0], rope[0]]))
    pool.release_buffers()
    assert pool.buffers() == []


def test_mla_pool_takes_given_buffers():
    bufs = [torch.empty(10, 1, 40) for _ in range(2)]
    pool = MLATokenToKVPool(6, 4, torch.float32, 32, 8, layer_num=2, device="cpu", buffers=bufs)
    assert pool.get_key_buffer(1).data_ptr() == bufs[1].data_ptr()
    with pytest.raises(ValueError, match="do not fit"):
        MLATokenToKVPool(7, 4, torch.float32, 32, 8, layer_num=2, device="cpu", buffers=bufs)
    with pytest.raises(ValueError, match="expected 3"):
        MLATokenToKVPool(6, 4, torch.float32, 32, 8, layer_num=3, device="cpu", buffers=bufs)
