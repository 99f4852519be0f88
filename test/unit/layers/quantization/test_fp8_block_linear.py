"""The block-scaled fp8 GEMM of native FP8 checkpoints: activations quantized per token and 128-column group,
the triton kernels (CPU: the interpreter, small shapes) against the torch reference."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")
register_cuda_ci(est_time=20, suite="per-commit-cuda")

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.quantization.fp8 import FP8_DTYPE, FP8_MAX, Fp8FusedMoEMethod
from sglang.srt.layers.quantization.fp8_block_kernels import block_fp8_gemm, quantize_groups
from sglang.srt.layers.quantization.fp8_block_linear import (
    block_fp8_matmul_reference,
    dequantize_blocks,
    fp8_block_linear,
    quantize_groups_reference,
)
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, triton_test_devices

DEVICES = triton_test_devices()


def block_quantized(n: int, k: int, gen: torch.Generator):
    """A weight quantized per 128x128 block, as the checkpoints store it (e4m3 + fp32 scale_inv)."""
    w = torch.randn(n, k, generator=gen) / 8
    w[:, :7] *= 20  # one block with a larger range than the others
    return Fp8FusedMoEMethod().quantize(w)


def test_quantize_groups_reference_uses_each_groups_range():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 300, generator=g)
    x[0, 128:256] *= 100
    x[1, 256:] = 0  # an all-zero (ragged) group must not divide by zero
    q, s = quantize_groups_reference(x)
    assert q.dtype == FP8_DTYPE and q.shape == (3, 300) and s.shape == (3, 3)
    assert q[0, 128:256].float().abs().max() == FP8_MAX and q[2, 256:].float().abs().max() == FP8_MAX
    assert torch.equal(q[1, 256:].float(), torch.zeros(44))
    back = q.float() * s.repeat_interleave(128, 1)[:, :300]
    assert ((back - x).abs() <= x.abs() / 16 + 1e-6).all()


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_groups_kernel_equals_reference(device):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 384 + 40, generator=g) * 3).to(device, torch.bfloat16 if device == "cuda" else torch.float32)
    q, s = quantize_groups(x)
    rq, rs = quantize_groups_reference(x)
    assert torch.equal(s.cpu(), rs.cpu())
    same = q.cpu().view(torch.uint8) == rq.cpu().view(torch.uint8)
    if device == "cpu":
        # The triton interpreter stores float8 wrongly where rounding carries into the next power of two
        # (124.7 -> 64 instead of 128; see test_fp8_linear.py): everywhere else the bits must agree, and the
        # GPU run checks every element.
        carried = rq.float().abs().log2().frac() == 0
        same |= carried.cpu()
        assert carried.float().mean() < 0.2
    assert same.all()


# (M, N, K): decode and prefill rows, ragged N and K (partial blocks), several K steps.
SHAPES = [(1, 128, 128), (5, 256, 384), (33, 192, 200), (17, 384, 256)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_block_gemm_kernel_equals_reference(device, m, n, k, with_bias):
    g = torch.Generator().manual_seed(m * n + k)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cuda":
        m, n, k = m * 16, n * 8, k * 8
    qw, sw = block_quantized(n, k, g)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    bias = torch.randn(n, generator=g).to(device, dtype) if with_bias else None
    qw, sw = qw.to(device), sw.to(device)
    # The GPU quantizes with the kernel; the interpreter's float8 stores are wrong (see above), so the CPU
    # feeds the GEMM kernel the reference quantization.
    qx, sx = quantize_groups(x) if device == "cuda" else quantize_groups_reference(x)
    got = block_fp8_gemm(qx, sx, qw, sw, bias, dtype)
    want = block_fp8_matmul_reference(qx.cpu(), sx.cpu(), qw.cpu(), sw.cpu())
    if bias is not None:
        want = want + bias.float().cpu()
    tol = 1e-4 if device == "cpu" else 2e-2
    torch.testing.assert_close(got.float().cpu(), want, rtol=tol, atol=tol * want.abs().max().item())
    # fp8_block_linear: the same kernels behind the layer's entry point, and near the full-precision product.
    via_layer = fp8_block_linear(x, qw, sw, bias)
    torch.testing.assert_close(via_layer.float().cpu(), got.float().cpu(), rtol=tol, atol=tol)
    exact = F.linear(
        x.float().cpu(), dequantize_blocks(qw.cpu(), sw.cpu()), None if bias is None else bias.float().cpu()
    )
    assert (via_layer.float().cpu() - exact).norm() / exact.norm() < 0.05


def test_cpu_entry_point_matches_the_reference_product():
    g = torch.Generator().manual_seed(9)
    qw, sw = block_quantized(256, 256, g)
    x = torch.randn(2, 3, 256, generator=g)
    got = fp8_block_linear(x, qw, sw, None)
    qx, sx = quantize_groups_reference(x.view(6, 256))
    assert got.shape == (2, 3, 256)
    assert torch.equal(got.view(6, 256), block_fp8_matmul_reference(qx, sx, qw, sw))


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("m", [1, 8, 64, 256, 4096])  # decode batches and prefill chunks
def test_gpu_block_gemm_against_bf16(m):
    """Qwen3-8B's MLP shapes: the fp8 layer stays within e4m3's few percent of the bf16 GEMM."""
    g = torch.Generator().manual_seed(m)
    n, k = 12288, 4096
    qw, sw = block_quantized(n, k, g)
    qw, sw = qw.cuda(), sw.cuda()
    x = torch.randn(m, k, generator=g).cuda().bfloat16()
    got = fp8_block_linear(x, qw, sw, None)
    exact = x.float() @ dequantize_blocks(qw, sw).t()
    assert got.dtype == torch.bfloat16
    assert ((got.float() - exact).norm() / exact.norm()).item() < 0.05
