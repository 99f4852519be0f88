"""The fused K/V store equals two index_puts, for K/V that are strided views of a qkv projection."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import os

import pytest
import torch

from sglang.srt.mem_cache.kv_store_kernel import can_store_kv_fused, store_kv

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="CPU cases need TRITON_INTERPRET=1 (conftest sets it without a GPU)")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens,hq,hkv,d,dtype", [(1, 8, 2, 64, torch.bfloat16), (37, 6, 3, 96, torch.float16),
                                                  (5, 4, 4, 64, torch.uint8)])  # uint8: the fp8 pool's storage
def test_store_kv_matches_index_put(device, tokens, hq, hkv, d, dtype):
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randint(0, 255, (tokens, (hq + 2 * hkv) * d), generator=gen).to(dtype).to(device)
    k = qkv[:, hq * d:(hq + hkv) * d].view(tokens, hkv, d)  # strided views, as the attention layer has them
    v = qkv[:, (hq + hkv) * d:].view(tokens, hkv, d)
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
