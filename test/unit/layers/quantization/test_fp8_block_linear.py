"""The block-scaled fp8 GEMM of native FP8 checkpoints: activations quantized per token and 128-column group,
the triton kernels (CPU: the interpreter, small shapes) against the torch reference."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")
register_cuda_ci(est_time=20, suite="per-commit-cuda")

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.quantization.block_fp8_activation import ROW_MAJOR, ActivationLayout
from sglang.srt.layers.quantization.fp8 import FP8_DTYPE, FP8_MAX, Fp8FusedMoEMethod
from sglang.srt.layers.quantization.fp8_block_kernels import (
    block_fp8_gemm,
    cublas_block_fp8_gemm,
    quantize_groups,
    takes_cublas_block_gemm,
)
from sglang.srt.layers.quantization.fp8_block_linear import (
    block_fp8_matmul_reference,
    dequantize_blocks,
    fp8_block_linear,
    quantize_activation,
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
@pytest.mark.parametrize("k", [384 + 40, 11 * 128 + 40])  # 4 groups: one program a row; 12: two, the second ragged
def test_quantize_groups_kernel_equals_reference(device, k):
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(5, k, generator=g) * 3).to(device, torch.bfloat16 if device == "cuda" else torch.float32)
    x[2, 1024:1152] *= 50  # a group of another range in the second program's part of the row
    x[3, :64], x[3, 64] = torch.linspace(-4e-4, 4e-4, 64), 10.0  # codes below e4m3's smallest normal, ties too
    q, s = quantize_groups(x)
    rq, rs = quantize_groups_reference(x)
    assert torch.equal(s.cpu(), rs.cpu())
    # Every code, the carries into the next power of two and e4m3's subnormals (below 2^-6) included: those the
    # triton interpreter's own conversion rounds wrongly (fp8_tile.py rounds them by hand there).
    codes = rq.float().abs()
    assert ((codes.log2().frac() == 0) & (codes > 0)).any() and ((codes > 0) & (codes < 2**-6)).any()
    assert torch.equal(q.cpu().view(torch.uint8), rq.cpu().view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_groups_pads_rows_and_lays_scales_out_column_major(device):
    """cuBLAS's operand layout: rows padded to a multiple of 4 with zero rows, scales [M, K/128] column-major; the
    real rows equal the unpadded quantization's."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(5, 384, generator=g) * 3).to(device, torch.bfloat16 if device == "cuda" else torch.float32)
    q, s = quantize_groups(x)
    pq, ps = quantize_groups(x, pad_rows_to=4, column_major_scales=True)
    assert pq.shape == (8, 384) and ps.shape == (8, 3) and ps.stride() == (1, 8)
    assert torch.equal(ps[:5].cpu(), s.cpu()) and torch.equal(pq[:5].view(torch.uint8), q.view(torch.uint8))
    assert not pq[5:].float().any() and (ps[5:] > 0).all()


def test_cublas_branch_is_not_taken_on_the_cpu_or_for_other_shapes_and_dtypes():
    qw = torch.zeros(256, 512, dtype=FP8_DTYPE)
    assert not takes_cublas_block_gemm(qw, torch.bfloat16)  # a CPU tensor
    if torch.cuda.is_available():
        assert not takes_cublas_block_gemm(qw.cuda(), torch.float32)
        assert not takes_cublas_block_gemm(torch.zeros(256, 384, dtype=FP8_DTYPE, device="cuda"), torch.bfloat16)
        assert not takes_cublas_block_gemm(torch.zeros(192, 512, dtype=FP8_DTYPE, device="cuda"), torch.bfloat16)


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
    qx, sx = quantize_groups(x)
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("m", [1, 8, 13, 64, 300])  # 1, 13 and 300 rows padded to 4
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_cublas_branch_equals_the_triton_gemm(m, with_bias):
    """On the H200 the engine sends block-fp8 products to cuBLAS's block-scaled GEMM: the same quantized operands
    give the triton GEMM's product to the rounding of the accumulation order."""
    g = torch.Generator().manual_seed(100 + m)
    n, k = 1024, 2048
    qw, sw = (t.cuda() for t in block_quantized(n, k, g))
    x = torch.randn(m, k, generator=g).cuda().bfloat16()
    bias = torch.randn(n, generator=g).cuda().bfloat16() if with_bias else None
    assert takes_cublas_block_gemm(qw, torch.bfloat16), "the H200 with CUDA >= 12.9 takes cuBLAS block scaling"
    got = cublas_block_fp8_gemm(x, qw, sw, bias)
    qx, sx = quantize_groups(x)
    want = block_fp8_gemm(qx, sx, qw, sw, bias, torch.bfloat16)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16 and got.is_contiguous()
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    torch.testing.assert_close(fp8_block_linear(x, qw, sw, bias), got, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("m", [1, 5, 16, 17])
@pytest.mark.parametrize("split_k,pdl", [(1, False), (4, True)])
def test_gpu_skinny_plan_equals_the_cublas_branch(m, split_k, pdl):
    """Where the shape's ``N x K:fp8block`` plan has a skinny config for the row count, fp8_block_linear runs the
    skinny decode kernel on the same quantized operands: cuBLAS's product to the accumulation order; rows the plan
    does not cover stay on cuBLAS (the same bits)."""
    from sglang.srt.layers.decode_gemm import GemmConfig, GemmPlan

    g = torch.Generator().manual_seed(200 + m)
    n, k = 1024, 2048
    qw, sw = (t.cuda() for t in block_quantized(n, k, g))
    x = torch.randn(m, k, generator=g).cuda().bfloat16()
    bias = torch.randn(n, generator=g).cuda().bfloat16()
    config = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=split_k, pdl=pdl)
    plan = GemmPlan(((16, config),))
    got = fp8_block_linear(x, qw, sw, bias, plan)
    want = cublas_block_fp8_gemm(x, qw, sw, bias)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    if m > 16:  # beyond the plan: cuBLAS itself
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_activation_handed_over_quantized_gives_the_same_product_on_the_cpu():
    """fp8_block_linear of a BlockFp8Activation (what a norm or SiLU-and-mul kernel hands a block-fp8 projection)
    equals that of the bf16 tensor it quantizes, in either layout (cuBLAS's padded rows left out)."""
    g = torch.Generator().manual_seed(7)
    qw, sw = block_quantized(256, 384, g)
    x = torch.randn(5, 384, generator=g)
    bias = torch.randn(256, generator=g)
    want = fp8_block_linear(x, qw, sw, bias)
    for layout in (ROW_MAJOR, ActivationLayout(4, True)):
        handed = quantize_activation(x, layout)
        assert handed.q.shape == (8 if layout.pad_rows_to == 4 else 5, 384)
        assert torch.equal(fp8_block_linear(handed, qw, sw, bias), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("m", [1, 5, 300])
def test_gpu_branch_layouts_and_a_handed_over_activation(m):
    """input_layout names the layout of the branch fp8_block_linear takes for the row count (the skinny plan's rows
    and the triton GEMM: row-major; cuBLAS: padded rows, column-major scales); an activation handed over in that
    layout gives the same bits as quantizing inside, and one in another layout is refused by name."""
    from sglang.srt.layers.decode_gemm import GemmConfig, GemmPlan
    from sglang.srt.layers.quantization.fp8_block_kernels import CUBLAS_LAYOUT, input_layout

    g = torch.Generator().manual_seed(300 + m)
    qw, sw = (t.cuda() for t in block_quantized(1024, 2048, g))
    x = torch.randn(m, 2048, generator=g).cuda().bfloat16()
    config = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=4, pdl=True)
    plan = GemmPlan(((4, config),))
    layout = input_layout(qw, plan, m, x.dtype)
    assert layout == (ROW_MAJOR if m <= 4 else CUBLAS_LAYOUT)
    assert input_layout(qw, plan, m, torch.float32) == ROW_MAJOR  # fp32: the triton GEMM
    want = fp8_block_linear(x, qw, sw, None, plan)
    assert torch.equal(fp8_block_linear(quantize_activation(x, layout), qw, sw, None, plan), want)
    other = ActivationLayout(4, True) if layout == ROW_MAJOR else ROW_MAJOR
    with pytest.raises(ValueError, match="where this GEMM branch takes"):
        fp8_block_linear(quantize_activation(x, other), qw, sw, None, plan)
