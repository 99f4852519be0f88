"""MLA's per-head projections at decode sizes (triton_ops/head_matmul.py) against torch.bmm: CPU in the triton
interpreter (fp32), GPU in bf16 and inside a CUDA graph after a kernel that writes their input (PDL)."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import pytest
import torch

from sglang.srt.layers.attention.triton_ops.head_matmul import head_matmul
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, triton_test_devices

DEVICES = triton_test_devices()


def _bmm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.bmm(x.double().transpose(0, 1), w.double()).transpose(0, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens", [1, 5, 70])
@pytest.mark.parametrize("layout", ["w_uk", "w_uv"])
def test_each_head_times_its_own_matrix(device, tokens, layout):
    """W_UK's layout (w[h] rows of kv_b_proj: [K, N] row-major) and W_UV's (the same rows read transposed: [K, N]
    with K contiguous); a query view strided like q_nope inside the fused q rows; N not a multiple of the column
    tile, K not of the K step, 70 tokens over two token tiles."""
    dtype, tol = (torch.float32, 1e-5) if device == "cpu" else (torch.bfloat16, 2e-2)
    g = torch.Generator().manual_seed(tokens)
    heads, k, n = 3, 80, 96
    rows = torch.randn(heads, n + k, 2 * k if layout == "w_uk" else n + k, generator=g).to(device, dtype)
    # W_UK: [H, K, N] views of [H, K + N, 2K] rows (strides (.., 2K, 1)); W_UV: [H, N, K] rows read as [H, K, N]
    # (strides (.., 1, N + K))
    w = rows[:, :k, :n] if layout == "w_uk" else rows[:, :n, :k].transpose(1, 2)
    fused = torch.randn(tokens, heads, k + 16, generator=g).to(device, dtype)
    x = fused[:, :, :k]  # rows of k values every k + 16: the query's nope part inside its head
    out = head_matmul(x, w)
    assert out.shape == (tokens, heads, n) and out.dtype == dtype
    ref = _bmm_reference(x, w)
    assert (out.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())
    into = torch.empty(heads, tokens, n, dtype=dtype, device=device).transpose(0, 1)  # any strides, rows contiguous
    assert head_matmul(x, w, out=into) is into and torch.equal(into, out)


def test_shapes_are_checked():
    x, w = torch.randn(2, 3, 8), torch.randn(3, 8, 16)
    with pytest.raises(ValueError, match="x \\[T, H, K\\] with contiguous rows and w \\[H, K, N\\]"):
        head_matmul(x, torch.randn(4, 8, 16))
    with pytest.raises(ValueError, match="x \\[T, H, K\\] with contiguous rows"):
        head_matmul(torch.randn(2, 3, 16)[:, :, ::2], w)
    with pytest.raises(ValueError, match="out must be \\[2, 3, 16\\]"):
        head_matmul(x, w, out=torch.empty(2, 3, 8))
    assert head_matmul(torch.randn(0, 3, 8), w).shape == (0, 3, 16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
def test_in_a_cuda_graph_it_waits_for_the_kernel_that_writes_its_input():
    """Launched with PDL after RMSNorm writes x (streaming its first weight tile before it waits): each replay's
    product is of that replay's x, bit for bit what an eager launch gives."""
    from sglang.srt.layers.fused_elementwise import rmsnorm

    heads, k, n = 16, 128, 512
    src = torch.randn(8, heads * k, device="cuda", dtype=torch.bfloat16)
    norm_weight = torch.rand(heads * k, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.empty_like(src)
    w = torch.randn(heads, k, n, device="cuda", dtype=torch.bfloat16) / 16

    def step():
        rmsnorm(src, norm_weight, 1e-6, out=x)
        return head_matmul(x.view(8, heads, k), w)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for seed in range(3):
        src.copy_(torch.randn(src.shape, generator=torch.Generator().manual_seed(seed)).to(src))
        graph.replay()
        torch.cuda.synchronize()
        expected_x = rmsnorm(src, norm_weight, 1e-6).view(8, heads, k)
        assert torch.equal(captured, head_matmul(expected_x, w))
        ref = _bmm_reference(expected_x, w)
        assert (captured.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
