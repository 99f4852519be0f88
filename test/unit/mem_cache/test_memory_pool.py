"""MHATokenToKVPool holds memory only (the allocator counts tokens); fp8 KV is stored as bytes by one rule."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

import pytest
import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, kv_storage_dtype


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
