"""The fused K/V store equals two index_puts, for K/V that are strided views of a qkv projection."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import pytest
import torch

from sglang.srt.mem_cache.kv_store_kernel import can_store_kv_fused, store_kv
from sglang.test.gpu_utils import triton_test_devices

DEVICES = triton_test_devices()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "tokens,hq,hkv,d,dtype", [(1, 8, 2, 64, torch.bfloat16), (37, 6, 3, 96, torch.float16), (5, 4, 4, 64, torch.uint8)]
)  # uint8: the fp8 pool's storage
def test_store_kv_matches_index_put(device, tokens, hq, hkv, d, dtype):
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randint(0, 255, (tokens, (hq + 2 * hkv) * d), generator=gen).to(dtype).to(device)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)  # strided views, as the attention layer has them
    v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
    slots = 3 * tokens + 5
    loc = torch.randperm(slots, generator=gen)[:tokens].to(device)
    k_buf = torch.zeros(slots, hkv, d, dtype=dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    assert can_store_kv_fused(k, v, k_buf, v_buf)
    store_kv(k, v, k_buf, v_buf, loc)
    k_ref, v_ref = torch.zeros_like(k_buf), torch.zeros_like(v_buf)
    k_ref[loc] = k
    v_ref[loc] = v
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)


def test_unfusable_layouts_are_refused():
    k = torch.zeros(4, 2, 8, dtype=torch.bfloat16)
    buf = torch.zeros(10, 2, 8, dtype=torch.bfloat16)
    assert not can_store_kv_fused(k.float(), k, buf, buf)  # dtype conversion: the torch path
    assert not can_store_kv_fused(k.transpose(0, 1).contiguous().transpose(0, 1), k, buf, buf)  # heads not contiguous
    assert not can_store_kv_fused(k[:, :, :4], k, buf, buf)  # shape differs from the pool


@pytest.mark.parametrize("device", DEVICES)
def test_pool_offers_buffers_for_fused_store_only_when_it_can(device):
    """The pool hands its buffers to rotary's fused K/V store on CUDA in the activation dtype only."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    k = torch.zeros(3, 2, 64, dtype=torch.bfloat16, device=device)
    pool = MHATokenToKVPool(16, 1, torch.bfloat16, 2, 64, 64, 2, device)
    bufs = pool.fused_store_buffers(1, k, k)
    if device == "cpu":
        assert bufs is None  # the CPU stores with torch (set_kv_buffer)
    else:
        assert bufs[0] is pool.k_buffer[1] and bufs[1] is pool.v_buffer[1]
        fp8 = MHATokenToKVPool(16, 1, torch.float8_e4m3fn, 2, 64, 64, 2, device)
        assert fp8.fused_store_buffers(0, k, k) is None  # needs a cast: set_kv_buffer does it
        assert pool.fused_store_buffers(0, k.float(), k) is None
