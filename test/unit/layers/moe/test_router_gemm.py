"""layers/moe/router_gemm.py: the router's fp32 logits in one kernel equal torch's F.linear(x.float(), weight) to
fp32 rounding (a program per expert block and token), for bf16 and fp32 activations, ragged expert and K counts, and
strided activation rows; the CPU path, batches past KERNEL_MAX_TOKENS and batches whose weight re-reads pass
KERNEL_MAX_L2_BYTES (DeepSeek-V3's router past 18 tokens) are torch's (cuBLAS's) GEMM."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.moe import router_gemm
from sglang.srt.layers.moe.router_gemm import (
    KERNEL_MAX_L2_BYTES,
    KERNEL_MAX_TOKENS,
    RouterTile,
    router_logits,
    router_logits_triton,
)
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, triton_test_devices


@pytest.mark.parametrize("device", triton_test_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 5, 17])
@pytest.mark.parametrize("experts,hidden", [(64, 2048), (20, 200)])  # V2-Lite's router; nothing a power of two
def test_kernel_matches_torch(device, dtype, tokens, experts, hidden):
    gen = torch.Generator().manual_seed(tokens * 1000 + experts)
    weight = torch.randn(experts, hidden, generator=gen).to(device)
    # strided rows: a view into a wider buffer, as a decode graph's padded inputs can be
    x = torch.randn(tokens, hidden + 8, generator=gen).to(device=device, dtype=dtype)[:, :hidden]
    ours = router_logits_triton(x, weight)
    ref = F.linear(x.double(), weight.double())
    assert ours.dtype == torch.float32 and ours.shape == (tokens, experts)
    # fp32 sums of exact products in another order than torch's: within a few fp32 ulps of the K-long sum
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-5 * hidden**0.5)
    assert not torch.equal(ours[:, :1], ours[:, 1:2])  # not degenerate


@pytest.mark.parametrize("device", triton_test_devices())
@pytest.mark.parametrize("tile", [RouterTile(8, 512), RouterTile(2, 1024), RouterTile(4, 1024)], ids=str)
def test_every_tile_the_benchmark_times_matches_torch(device, tile):
    """bench_router_logits.py's other program tiles (fewer experts a program, longer K steps) compute the same logits;
    ragged experts and K (20 x 200) and V2-Lite's router."""
    gen = torch.Generator().manual_seed(tile.experts)
    for experts, hidden in ((20, 200), (64, 2048)):
        weight = torch.randn(experts, hidden, generator=gen).to(device)
        x = torch.randn(3, hidden, generator=gen).to(device=device, dtype=torch.bfloat16)
        ref = F.linear(x.double(), weight.double())
        torch.testing.assert_close(router_logits_triton(x, weight, tile).double(), ref, rtol=1e-5, atol=1e-3)


def test_no_tokens_and_bad_weights():
    w = torch.randn(8, 32)
    assert router_logits_triton(torch.empty(0, 32), w).shape == (0, 8)
    with pytest.raises(ValueError, match="fp32 weight"):
        router_logits_triton(torch.randn(2, 32), w.bfloat16())
    with pytest.raises(ValueError, match="fp32 weight"):
        router_logits_triton(torch.randn(2, 16), w)


def test_cpu_tensors_take_torch(monkeypatch):
    """Off CUDA the model's router is torch's own GEMM (the reference's), never the interpreter."""
    monkeypatch.setattr(router_gemm, "router_logits_triton", lambda *a: pytest.fail("the kernel ran on the CPU"))
    x, w = torch.randn(3, 32, dtype=torch.bfloat16), torch.randn(8, 32)
    assert torch.equal(router_logits(x, w), F.linear(x.float(), w))


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
def test_batches_past_the_kernels_take_cublas(monkeypatch):
    """Past KERNEL_MAX_TOKENS, or where tokens x the router weight's bytes pass KERNEL_MAX_L2_BYTES (DeepSeek-V3's
    256 x 7168 router past 18 tokens), the router is torch's cast and cuBLAS's fp32 GEMM; else the kernel."""
    calls = []
    real = router_gemm.router_logits_triton
    monkeypatch.setattr(
        router_gemm, "router_logits_triton", lambda *a: calls.append((a[1].shape[0], len(a[0]))) or real(*a)
    )
    small, large = torch.randn(64, 2048, device="cuda"), torch.randn(256, 7168, device="cuda")
    assert KERNEL_MAX_L2_BYTES // (large.numel() * 4) == 18 and KERNEL_MAX_L2_BYTES // (small.numel() * 4) > 64
    for w, counts in ((small, (1, KERNEL_MAX_TOKENS, KERNEL_MAX_TOKENS + 1)), (large, (1, 18, 19))):
        for tokens in counts:
            x = torch.randn(tokens, w.shape[1], device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(router_logits(x, w), F.linear(x.float(), w), rtol=1e-5, atol=1e-3)
    assert calls == [(64, 1), (64, KERNEL_MAX_TOKENS), (256, 1), (256, 18)]
