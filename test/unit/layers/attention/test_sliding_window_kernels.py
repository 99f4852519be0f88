from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")
register_cuda_ci(est_time=20, suite="per-commit-cuda")

# Sliding-window attention in the triton decode / extend kernels against a plain torch reference with
# transformers' Mistral mask: the query at position p sees the keys at positions p - window + 1 .. p.
# CPU: fp32 through the triton interpreter (small shapes); CUDA: bf16, longer contexts.

import math

import pytest
import torch

from sglang.srt.layers.attention.triton_ops import (
    DecodeKernelConfig,
    decode_attention_fwd,
    extend_attention_fwd,
    get_num_kv_splits,
)
from sglang.test.gpu_utils import triton_test_devices

DEVICES = triton_test_devices()


def window_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int) -> torch.Tensor:
    """[M, L] True where the query sees the key: causal, and within the last `window` positions."""
    q, k = query_pos[:, None], key_pos[None, :]
    return (k <= q) & (k > q - window)


def reference(q, k, v, mask, scale):
    """q [M, Hq, D], k/v [L, Hkv, D] -> [M, Hq, D] fp32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = torch.einsum("mhd,lhd->hml", q.float(), k) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, -1), v)


def packed(lens, device):
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(lens), 0)
    return indptr.to(device)


def setup(device):
    return (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [1, 7, 40, 1000])  # 1000: longer than every context (no effect)
@pytest.mark.parametrize("max_splits", [1, 4])
def test_decode_with_window(device, window, max_splits):
    dtype, tol = setup(device)
    lens = [1, 9, 150, 77] if device == "cpu" else [1, 9, 3000, 777]
    hq, hkv, d = 8, 2, 64
    gen = torch.Generator().manual_seed(window * 10 + max_splits)
    slots = sum(lens) + 11
    k_buf = torch.randn(slots, hkv, d, generator=gen).to(device, dtype)
    v_buf = torch.randn(slots, hkv, d, generator=gen).to(device, dtype)
    indices = torch.randperm(slots, generator=gen)[: sum(lens)].to(device, torch.int32)
    indptr = packed(lens, device)
    q = torch.randn(len(lens), hq, d, generator=gen).to(device, dtype)
    o = torch.full((len(lens), hq, d), float("nan"), device=device, dtype=dtype)
    logits = torch.empty(len(lens), hq, max_splits, d, device=device)
    lse = torch.empty(len(lens), hq, max_splits, device=device)
    splits = torch.empty(len(lens), dtype=torch.int32, device=device)
    get_num_kv_splits(splits, torch.tensor(lens, device=device, dtype=torch.int32), max_splits, 32, block_n=32)
    scale = 1 / math.sqrt(d)
    decode_attention_fwd(
        q, k_buf, v_buf, o, indptr, indices, logits, lse, splits, max_splits, scale,
        config=DecodeKernelConfig(block_n=32), sliding_window=window,
    )  # fmt: skip
    for i, n in enumerate(lens):
        s = indices[indptr[i] : indptr[i + 1]].long()
        mask = window_mask(torch.tensor([n - 1]), torch.arange(n), window)
        ref = reference(q[i : i + 1].cpu(), k_buf[s].cpu(), v_buf[s].cpu(), mask, scale)
        torch.testing.assert_close(o[i : i + 1].float().cpu(), ref, atol=tol, rtol=tol)
    full = o.clone()
    decode_attention_fwd(
        q, k_buf, v_buf, full, indptr, indices, logits, lse, splits, max_splits, scale,
        config=DecodeKernelConfig(block_n=32),
    )  # fmt: skip
    # The window changes the answer exactly where a context is longer than it.
    for i, n in enumerate(lens):
        if n > window:
            assert not torch.allclose(o[i].float(), full[i].float(), atol=tol, rtol=tol)
        else:
            torch.testing.assert_close(o[i], full[i], atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [1, 5, 33, 1000])
def test_extend_with_window(device, window):
    dtype, tol = setup(device)
    pre, ext = ([0, 40, 7], [37, 20, 1]) if device == "cpu" else ([0, 900, 70], [700, 300, 1])
    hq, hkv, d = 6, 2, 64
    gen = torch.Generator().manual_seed(window)
    slots = sum(pre) + 5
    k_buf = torch.randn(slots, hkv, d, generator=gen).to(device, dtype)
    v_buf = torch.randn(slots, hkv, d, generator=gen).to(device, dtype)
    indices = torch.randperm(slots, generator=gen)[: sum(pre)].to(device, torch.int64)
    kv_indptr, qo_indptr = packed(pre, device), packed(ext, device)
    n = sum(ext)
    q = torch.randn(n, hq, d, generator=gen).to(device, dtype)
    k_ext = torch.randn(n, hkv, d, generator=gen).to(device, dtype)
    v_ext = torch.randn(n, hkv, d, generator=gen).to(device, dtype)
    o = torch.full((n, hq, d), float("nan"), device=device, dtype=dtype)
    scale = 1 / math.sqrt(d)
    extend_attention_fwd(
        q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, indices, max(ext), scale, sliding_window=window
    )
    for i, (p, e) in enumerate(zip(pre, ext)):
        a, b = int(qo_indptr[i]), int(qo_indptr[i + 1])
        s = indices[kv_indptr[i] : kv_indptr[i + 1]].long()
        k = torch.cat([k_buf[s], k_ext[a:b]]).cpu()
        v = torch.cat([v_buf[s], v_ext[a:b]]).cpu()
        mask = window_mask(torch.arange(p, p + e), torch.arange(p + e), window)
        ref = reference(q[a:b].cpu(), k, v, mask, scale)
        torch.testing.assert_close(o[a:b].float().cpu(), ref, atol=tol, rtol=tol)
