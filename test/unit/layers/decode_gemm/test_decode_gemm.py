"""The skinny decode GEMM equals F.linear (CPU: through the triton interpreter, fp32; GPU: bf16, eager and
inside a CUDA graph), and the tuned table's choice per batch size is what its file says."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")
register_cuda_ci(est_time=70, suite="per-commit-cuda")

import glob
import json
import os

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers import decode_gemm
from sglang.srt.layers.decode_gemm import CUBLAS_ONLY, GemmConfig, GemmPlan, parse_table, plan_for_shape
from sglang.srt.layers.decode_gemm import kernel as gemm_kernel
from sglang.srt.layers.decode_gemm.kernel import prefetch_columns, skinny_linear
from sglang.srt.layers.decode_gemm.table import CONFIG_DIR, device_table_path, load_device_table
from sglang.srt.layers.quantization.block_fp8_activation import ROW_MAJOR
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, triton_test_devices

DEVICES = triton_test_devices()
# (device, pdl): PDL exists on the GPU only (pdl.pdl_available), so the CPU runs each case once, without it.
DEVICES_PDL = [
    pytest.param(p.values[0], pdl, marks=p.marks, id=f"{p.values[0]}-pdl{int(pdl)}")
    for p in DEVICES
    for pdl in ((False, True) if p.values[0] == "cuda" else (False,))
]
CFG = dict(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2)


def _reference(x, w, b):
    y = x.double() @ w.double().T
    return y + b.double() if b is not None else y


def _check(out, ref, dtype, relative=False):
    """fp32: within 1e-4 (of the largest |ref| with ``relative``: products of two sums grow large); bf16: 2%."""
    assert out.shape == ref.shape and out.dtype == dtype
    tol = (
        1e-4 * (ref.abs().max().item() if relative else 1.0)
        if dtype == torch.float32
        else 2e-2 * ref.abs().max().item()
    )
    assert (out.double() - ref).abs().max().item() <= tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 5, 17])
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear_matches_reference(device, m, split_k, with_bias):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(m * 10 + split_k)
    n, k = 48, 200  # N not a multiple of block_n, K not a multiple of block_k: both edges masked
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = torch.randn(n, k, generator=g).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype) if with_bias else None
    out = skinny_linear(x, w, b, GemmConfig(**CFG, split_k=split_k))
    _check(out, _reference(x, w, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear_on_fp8_operands_applies_both_scales(device, split_k, with_bias):
    from sglang.srt.layers.quantization.fp8_linear import quantize_rows

    out_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(40 + split_k)
    m, n, k = 5, 80, 200  # block_n 64 (fp8 wgmma on the GPU): the second column block is ragged
    x = (torch.randn(m, k, generator=g) * torch.tensor([1.0, 10.0, 0.1, 3.0, 1.0])[:, None]).to(device)
    qx, sx = quantize_rows(x)
    qw, sw = quantize_rows(torch.randn(n, k, generator=g).to(device))
    b = torch.randn(n, generator=g).to(device, out_dtype) if with_bias else None
    config = GemmConfig(block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=2, split_k=split_k)
    out = skinny_linear(qx, qw, b, config, scales=(sx, sw, out_dtype))
    ref = _reference(qx.double() * sx.double(), qw.double() * sw.double(), b)
    _check(out, ref, out_dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_block_fp8_split_tail_past_k_reads_no_scale(device):
    """K = 320 in two splits of 256: the second split's last tile lies wholly past K, and its scale-block index (3)
    runs past each scale row, past the end of both scale tensors for the last row and the last column block. What
    lies there (NaN here: the scales are the heads of NaN-filled buffers) must not reach the output: the step adds
    nothing. (Unmasked, this read made the last row NaN in a CPU suite run when the memory after the scales held a
    NaN.)"""
    from sglang.srt.layers.quantization.fp8_block_linear import block_fp8_matmul_reference, quantize_groups_reference

    out_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(7)
    m, n, k = 17, 200, 320
    qx, sx = quantize_groups_reference(torch.randn(m, k, generator=g))
    qw = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    sw = torch.rand(2, 3, generator=g) + 0.5
    x_scales = torch.full((sx.numel() + 64,), float("nan"))
    x_scales[: sx.numel()] = sx.flatten()
    w_scales = torch.full((sw.numel() + 64,), float("nan"))
    w_scales[: sw.numel()] = sw.flatten()
    x_scales, w_scales = x_scales.to(device), w_scales.to(device)
    config = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, split_k=2)
    assert config.k_split(k) == (2, 256)  # 4 tiles walked for K's 3
    out = skinny_linear(
        qx.to(device),
        qw.to(device),
        None,
        config,
        block_scales=(x_scales[: sx.numel()].view(m, 3), w_scales[: sw.numel()].view(2, 3), out_dtype),
    )
    assert torch.isfinite(out).all()
    _check(out, block_fp8_matmul_reference(qx, sx, qw, sw).double().to(device), out_dtype, relative=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,split_k", [(1, 1), (5, 3), (17, 2)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear_on_block_fp8_operands_scales_each_block(device, m, split_k, with_bias):
    """A block-fp8 weight (a scale per 128x128 block) against x quantized per token and 128-column group: each
    128-wide K step is one scale block, so the sum is block_fp8_matmul_reference's. N = 200 and K = 320 leave a
    ragged last block on both edges (and on the 64-wide column tiles); split-K cuts K on block boundaries."""
    from sglang.srt.layers.quantization.fp8_block_linear import block_fp8_matmul_reference, quantize_groups_reference

    out_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(60 + m + split_k)
    n, k = 200, 320
    x = (torch.randn(m, k, generator=g) * torch.linspace(0.1, 10.0, k)[None, :]).to(device)
    qx, sx = quantize_groups_reference(x)
    qw = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).to(device)
    sw = (torch.rand(2, 3, generator=g) + 0.5).to(device) / 100
    b = torch.randn(n, generator=g).to(device, out_dtype) if with_bias else None
    config = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, split_k=split_k)
    out = skinny_linear(qx, qw, b, config, block_scales=(sx, sw, out_dtype))
    ref = block_fp8_matmul_reference(qx, sx, qw, sw).double()
    _check(out, ref + b.double() if b is not None else ref, out_dtype, relative=True)


def _block_fp8_add_norm_case(device: str, g: torch.Generator):
    """A block-fp8 [200, 384] weight (two ragged scale rows), 5 rows of x, a residual and norm weight, and a
    block-scaled config that splits K in 3: (dtype, x, qweight, weight scales, residual, norm weight, config)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    m, n, k = 5, 200, 384
    x = torch.randn(m, k, generator=g).to(device, dtype)
    qw = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).to(device)
    sw = (torch.rand(2, 3, generator=g) + 0.5).to(device) / 100
    residual = torch.randn(m, n, generator=g).to(device, dtype)
    norm_weight = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
    config = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, split_k=3)
    return dtype, x, qw, sw, residual, norm_weight, config


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_addend", [False, True])
def test_block_fp8_split_k_sum_kernel_does_the_add_and_norm(device, with_addend):
    """add_norm (and the addend) on block-fp8 operands: the split-K partials are scaled as they are summed, so the
    sum kernel's residual add and norm give the same bits as the block-scaled GEMM, torch's add, then the norm
    kernel; fp8_block_linear_add_rmsnorm takes that path where the plan splits K, and returns None where it does not
    (a config of one split)."""
    from sglang.srt.layers.fused_elementwise import rmsnorm
    from sglang.srt.layers.quantization.fp8_block_linear import fp8_block_linear_add_rmsnorm, quantize_groups_reference

    g = torch.Generator().manual_seed(70 + with_addend)
    dtype, x, qw, sw, residual, norm_weight, config = _block_fp8_add_norm_case(device, g)
    addend = torch.randn(*residual.shape, generator=g).to(device, dtype) if with_addend else None
    qx, sx = quantize_groups_reference(x)
    product = skinny_linear(qx, qw, None, config, block_scales=(sx, sw, dtype))
    original, fused_residual = residual.clone(), residual.clone()
    normed = skinny_linear(
        qx, qw, None, config, block_scales=(sx, sw, dtype), add_norm=(fused_residual, norm_weight, 1e-6), addend=addend
    )
    expected = rmsnorm(product + addend if with_addend else product, norm_weight, 1e-6, residual=residual)
    assert torch.equal(fused_residual, residual) and torch.equal(normed, expected)
    if device == "cpu":  # the layer's entry point (on the GPU its activations go through the quantization kernel)
        again = original.clone()
        plan = GemmPlan(((8, config),))
        out = fp8_block_linear_add_rmsnorm(x, qw, sw, plan, again, norm_weight, 1e-6, addend)
        assert out is not None and torch.equal(out, expected)
        one_split = GemmPlan(((8, GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2)),))
        assert fp8_block_linear_add_rmsnorm(x, qw, sw, one_split, again, norm_weight, 1e-6, addend) is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cublas_layout", [False, True], ids=["row-major", "cublas"])
def test_split_k_add_norm_hands_the_next_block_fp8_projection_its_norm_quantized(device, cublas_layout):
    """add_norm with ``quantize``: the sum kernel writes the norm per token and 128-column group (a ragged last
    group: N 200) in the next projection's layout, the same bits as its bf16 output through the quantization
    kernel, with the same residual; fp8_block_linear_add_rmsnorm passes it through, and takes its own input handed
    over quantized (a BlockFp8Activation, as SiLU-and-mul gives down_proj) with the same result."""
    from sglang.srt.layers.quantization.block_fp8_activation import ActivationLayout
    from sglang.srt.layers.quantization.fp8_block_kernels import quantize_groups
    from sglang.srt.layers.quantization.fp8_block_linear import fp8_block_linear_add_rmsnorm, quantize_activation

    layout = ActivationLayout(4, True) if cublas_layout else ROW_MAJOR
    dtype, x, qw, sw, residual, norm_weight, config = _block_fp8_add_norm_case(
        device, torch.Generator().manual_seed(90)
    )
    m = x.shape[0]
    qx, sx = quantize_groups(x)
    want_residual = residual.clone()
    normed = skinny_linear(
        qx, qw, None, config, block_scales=(sx, sw, dtype), add_norm=(want_residual, norm_weight, 1e-6)
    )
    want_q, want_s = quantize_groups(normed, layout.pad_rows_to, layout.column_major_scales)
    plan = GemmPlan(((8, config),))
    for handed_over in (False, True):
        got_residual = residual.clone()
        x_in = quantize_activation(x) if handed_over else x
        got = fp8_block_linear_add_rmsnorm(x_in, qw, sw, plan, got_residual, norm_weight, 1e-6, quantize=layout)
        assert got.rows == m and got.layout == layout and got.scale.stride() == want_s.stride()
        assert torch.equal(got.q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(got.scale, want_s)
        assert torch.equal(got_residual, want_residual)
    with pytest.raises(ValueError, match="takes ActivationLayout"):  # handed over in another branch's layout
        fp8_block_linear_add_rmsnorm(quantize_activation(x, layout=ActivationLayout(4, True)), qw, sw, plan,
                                     residual.clone(), norm_weight, 1e-6)  # fmt: skip


def test_block_scales_need_128_wide_k_steps():
    qx, qw = torch.zeros(1, 256, dtype=torch.float8_e4m3fn), torch.zeros(64, 256, dtype=torch.float8_e4m3fn)
    scales = (torch.ones(1, 2), torch.ones(1, 2), torch.float32)
    for bad in (dict(block_k=64), dict(block_k=256)):
        config = GemmConfig(**{**CFG, "block_n": 64, **bad})
        with pytest.raises(ValueError, match="block_k 128"):
            skinny_linear(qx, qw, None, config, block_scales=scales)


def _silu_and_mul_reference(y):
    d = y.shape[-1] // 2
    return F.silu(y[:, :d]) * y[:, d:]


@pytest.mark.parametrize("device,pdl", DEVICES_PDL)
@pytest.mark.parametrize("m", [1, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear_with_silu_and_mul_epilogue(device, pdl, m, with_bias):
    """weight = [gate; up]: the kernel returns silu(gate) * up, each program taking the same columns of both
    halves (N = 40 per half: the second column block is ragged, and must not read the other half's rows)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(70 + m)
    n, k = 40, 200
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = torch.randn(2 * n, k, generator=g).to(device, dtype)
    b = torch.randn(2 * n, generator=g).to(device, dtype) if with_bias else None
    out = skinny_linear(x, w, b, GemmConfig(**CFG, pdl=pdl), silu_and_mul=True)
    _check(out, _silu_and_mul_reference(_reference(x, w, b)), dtype, relative=True)


@pytest.mark.parametrize("device", DEVICES)
def test_silu_and_mul_epilogue_on_fp8_operands_scales_each_half(device):
    from sglang.srt.layers.quantization.fp8_linear import quantize_rows

    out_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(77)
    m, n, k = 5, 80, 200
    qx, sx = quantize_rows(torch.randn(m, k, generator=g).to(device))
    rows = torch.randn(2 * n, k, generator=g) * torch.linspace(0.1, 10.0, 2 * n)[:, None]  # scales differ per row
    qw, sw = quantize_rows(rows.to(device))
    config = GemmConfig(block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=2)
    out = skinny_linear(qx, qw, None, config, scales=(sx, sw, out_dtype), silu_and_mul=True)
    ref = _reference(qx.double() * sx.double(), qw.double() * sw.double(), None)
    _check(out, _silu_and_mul_reference(ref), out_dtype, relative=True)


def test_silu_and_mul_epilogue_refuses_split_k_and_odd_rows():
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="split_k 1"):
        skinny_linear(x, torch.randn(32, 64), None, GemmConfig(**CFG, split_k=2), silu_and_mul=True)
    with pytest.raises(ValueError, match="even number"):
        skinny_linear(x, torch.randn(33, 64), None, GemmConfig(**CFG), silu_and_mul=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 5, 17])
@pytest.mark.parametrize("split_k", [2, 3])
@pytest.mark.parametrize("with_addend", [False, True])
def test_split_k_sum_kernel_does_the_add_and_norm_after_the_gemm_bit_for_bit(device, m, split_k, with_addend):
    """add_norm: the sum kernel adds the residual in place and returns its RMSNorm, the same bits as the GEMM
    followed by the norm kernel (``fused_elementwise.rmsnorm``); with an addend (DeepSeek's routed experts), as
    the GEMM, torch's add, then the norm kernel. N = 40: the row's masked tail must add nothing to the variance;
    rows of very different scale catch a norm taken over the wrong row."""
    from sglang.srt.layers.fused_elementwise import rmsnorm

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(100 + m * split_k)
    n, k = 40, 200
    x = (torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]).to(device, dtype)
    w = torch.randn(n, k, generator=g).to(device, dtype)
    residual = torch.randn(m, n, generator=g).to(device, dtype)
    norm_weight = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
    config = GemmConfig(**CFG, split_k=split_k)
    addend = (torch.randn(m, n, generator=g) * 3).to(device, dtype) if with_addend else None
    stream = _reference(x, w, None) + residual.double() + (addend.double() if with_addend else 0)
    fused_residual = residual.clone()
    normed = skinny_linear(x, w, None, config, add_norm=(fused_residual, norm_weight, 1e-5), addend=addend)
    product = skinny_linear(x, w, None, config)
    expected = rmsnorm(product + addend if with_addend else product, norm_weight, 1e-5, residual=residual)
    assert torch.equal(fused_residual, residual) and torch.equal(normed, expected)
    _check(fused_residual, stream, dtype, relative=True)
    _check(normed, stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_weight.double(), dtype)


def test_add_norm_needs_a_split_k_config_and_matching_shapes():
    x, w = torch.randn(2, 64), torch.randn(32, 64)
    add_norm = (torch.zeros(2, 32), torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="add_norm needs a split-K config"):
        skinny_linear(x, w, None, GemmConfig(**CFG), add_norm=add_norm)
    with pytest.raises(ValueError, match="add_norm needs a split-K config"):
        skinny_linear(torch.randn(2, 16), w[:, :16], None, GemmConfig(**CFG, split_k=2), add_norm=add_norm)  # 1 tile
    with pytest.raises(ValueError, match="row-contiguous \\[2, 32\\] residual"):
        skinny_linear(x, w, None, GemmConfig(**CFG, split_k=2), add_norm=(torch.zeros(2, 16), torch.ones(32), 1e-6))
    with pytest.raises(ValueError, match="addend and quantize need add_norm"):
        skinny_linear(x, w, None, GemmConfig(**CFG, split_k=2), addend=torch.zeros(2, 32))
    with pytest.raises(ValueError, match="addend and quantize need add_norm"):
        skinny_linear(x, w, None, GemmConfig(**CFG, split_k=2), quantize=ROW_MAJOR)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_add_rmsnorm_falls_back_wherever_the_kernel_would_refuse(device):
    """One rule (``table.add_norm_refusal``): where it refuses, ``linear_add_rmsnorm`` returns None (the caller
    runs the GEMM, then the norm kernel) instead of raising; where it accepts, the sum kernel is used."""
    from sglang.srt.layers.decode_gemm.table import MAX_ADD_NORM_COLUMNS, add_norm_refusal

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    split2 = GemmConfig(**CFG, split_k=2)
    x, w = torch.randn(2, 64).to(device, dtype), torch.randn(32, 64).to(device, dtype)
    norm_w, residual = torch.ones(32, device=device, dtype=dtype), torch.zeros(2, 32, device=device, dtype=dtype)
    assert add_norm_refusal(split2, 2, 64, 32, residual, norm_w) is None
    refusals = {
        "split 1": add_norm_refusal(GemmConfig(**CFG), 2, 64, 32, residual, norm_w),
        "one K tile": add_norm_refusal(split2, 2, 16, 32, residual, norm_w),
        "fp8": add_norm_refusal(split2, 2, 64, 32, residual, norm_w, scaled=True),
        "silu": add_norm_refusal(split2, 2, 64, 32, residual, norm_w, silu_and_mul=True),
        "wide row": add_norm_refusal(split2, 2, 64, MAX_ADD_NORM_COLUMNS + 16, residual, norm_w),
        "residual rows": add_norm_refusal(split2, 2, 64, 32, torch.zeros(3, 32), norm_w),
        "residual strided": add_norm_refusal(split2, 2, 64, 32, torch.zeros(32, 2).t(), norm_w),
        "norm weight": add_norm_refusal(split2, 2, 64, 32, residual, torch.ones(16)),
        "addend rows": add_norm_refusal(split2, 2, 64, 32, residual, norm_w, addend=torch.zeros(3, 32)),
        "addend strided": add_norm_refusal(split2, 2, 64, 32, residual, norm_w, addend=torch.zeros(32, 2).t()),
    }
    assert all(isinstance(reason, str) and "add_norm needs" in reason for reason in refusals.values()), refusals
    plan = GemmPlan(((8, split2),))
    assert decode_gemm.linear_add_rmsnorm(x, w, plan, residual[:1], norm_w, 1e-6) is None  # rows of another batch
    assert decode_gemm.linear_add_rmsnorm(x, w, GemmPlan(((8, GemmConfig(**CFG)),)), residual, norm_w, 1e-6) is None
    fused = decode_gemm.linear_add_rmsnorm(x, w, plan, residual, norm_w, 1e-6)
    assert fused is not None and fused.shape == (2, 32)
    _check(residual, _reference(x, w, None), dtype)  # the GEMM's output, added in place to the zero residual


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("k", [4096, 14336])
@pytest.mark.parametrize("m,block_m,split_k", [(5, 16, 1), (5, 16, 2), (29, 32, 2), (32, 32, 1), (64, 64, 4)])
def test_fp8_sums_over_a_long_k_stay_exact(k, m, block_m, split_k):
    """Hopper's fp8 MMA accumulates in fewer bits than fp32; left alone over all of K (triton's default) the
    sums drift by ~1e-2. The kernel moves them to fp32 every 128 products. Checked per row, every row
    tile the tuned tables use."""
    from sglang.srt.layers.quantization.fp8_linear import quantize_rows

    g = torch.Generator().manual_seed(k + m)
    qx, sx = quantize_rows(torch.randn(m, k, generator=g).cuda())
    qw, sw = quantize_rows(torch.randn(256, k, generator=g).abs().cuda())  # positive: the sums grow with K
    ref = _reference(qx.double() * sx.double(), qw.double() * sw.double(), None)
    config = GemmConfig(block_m=block_m, block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=split_k)
    out = skinny_linear(qx, qw, None, config, scales=(sx, sw, torch.float32))
    err = ((out.double() - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)).max().item()
    print(f"fp8 skinny relative error, K={k} M={m} block_m={block_m} split_k={split_k}: {err:.2e}")
    assert err < 2e-3


@pytest.mark.parametrize("device", DEVICES)
def test_rows_beyond_one_row_block_and_zero_rows(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 64, generator=g).to(device, dtype)  # 3 row blocks of 16
    w = torch.randn(32, 64, generator=g).to(device, dtype)
    _check(skinny_linear(x, w, None, GemmConfig(**CFG)), _reference(x, w, None), dtype)
    assert skinny_linear(x[:0], w, None, GemmConfig(**CFG)).shape == (0, 32)


def test_skinny_linear_rejects_a_non_contiguous_weight():
    w = torch.randn(64, 32).T  # K stride 64
    with pytest.raises(ValueError, match="K-contiguous"):
        skinny_linear(torch.randn(2, 64), w, None, GemmConfig(**CFG))


@pytest.mark.parametrize("device", DEVICES)
def test_linear_uses_the_plan_per_batch_size_and_falls_back_to_f_linear(device, monkeypatch):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    calls = []
    monkeypatch.setattr(decode_gemm.kernel, "skinny_linear", lambda *a: calls.append(a[0].shape[0]) or F.linear(*a[:3]))
    plan = GemmPlan(((4, GemmConfig(**CFG)), (16, None), (32, GemmConfig(**CFG, split_k=2))))
    w = torch.randn(24, 64, device=device, dtype=dtype)
    for rows in (1, 4, 5, 16, 17, 32, 33):
        x = torch.randn(rows, 64, device=device, dtype=dtype)
        assert torch.equal(decode_gemm.linear(x, w, None, plan), F.linear(x, w))
    assert calls == [1, 4, 17, 32]  # 5..16 chose cuBLAS, 33 is past the table
    x_strided = torch.randn(64, 2, device=device, dtype=dtype).T  # rows not K-contiguous
    decode_gemm.linear(x_strided, w, None, plan)
    assert calls == [1, 4, 17, 32]
    decode_gemm.linear(torch.randn(3, 64, device=device, dtype=dtype), w, None, CUBLAS_ONLY)
    assert calls == [1, 4, 17, 32]


def test_parse_table_orders_batches_and_validates_configs():
    plans = parse_table({"shapes": {"24x64": {"32": None, "1": CFG, "8": {**CFG, "split_k": 4}}}})
    plan = plan_for_shape(plans, 24, 64)
    assert [b for b, _ in plan.by_batch] == [1, 8, 32]
    assert plan.config_for(1) == GemmConfig(**CFG)
    assert plan.config_for(2).split_k == 4 and plan.config_for(8).split_k == 4
    assert plan.config_for(9) is None and plan.config_for(33) is None
    assert plan.uses_skinny_kernel and not GemmPlan(((4, None),)).uses_skinny_kernel
    assert plan_for_shape(plans, 64, 24) is CUBLAS_ONLY
    with pytest.raises(ValueError, match="block_n"):
        parse_table({"shapes": {"24x64": {"1": {**CFG, "block_n": 24}}}})
    with pytest.raises(ValueError, match="batch sizes"):
        parse_table({"shapes": {"24x64": {"0": CFG}}})


def test_no_table_for_an_untuned_gpu_and_the_shipped_tables_parse():
    assert load_device_table("A GPU nobody tuned") == {}
    path = device_table_path("NVIDIA H200")
    with open(path) as f:
        raw = json.load(f)
    plans = parse_table(raw)
    assert raw["device"] == "NVIDIA H200" and plans
    assert all(key.count("x") == 1 for key in plans)


def test_attach_gemm_plans_by_weight_shape():
    from sglang.srt.layers.linear import ReplicatedLinear, attach_gemm_plans

    model = torch.nn.Sequential(ReplicatedLinear(64, 24), ReplicatedLinear(24, 64))
    plans = parse_table({"shapes": {"24x64": {"8": CFG}}})
    assert attach_gemm_plans(model, plans) == 1
    assert model[0].gemm_plan.config_for(8) == GemmConfig(**CFG)
    assert model[1].gemm_plan is CUBLAS_ONLY
    # A block-fp8 checkpoint's layer takes its own entry (N x K:fp8block), never the full-precision one.
    block = torch.nn.Sequential(ReplicatedLinear(64, 24, quantization="fp8_block"))
    block_cfg = {**CFG, "block_n": 64, "block_k": 128}
    assert attach_gemm_plans(block, plans) == 0 and block[0].gemm_plan is CUBLAS_ONLY
    assert attach_gemm_plans(block, parse_table({"shapes": {"24x64:fp8block": {"4": block_cfg}}})) == 1
    assert block[0].gemm_plan.config_for(3) == GemmConfig(**block_cfg) and block[0].gemm_plan.config_for(5) is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
def test_merged_gate_up_fuses_silu_and_mul_where_its_silu_plan_says(device, fp8, monkeypatch):
    """attach_gemm_plans gives a gate/up pair its ``N x K:silu`` plan; silu_and_mul then runs one fused kernel
    for the planned row counts and the projection + activation kernel elsewhere, with the same result. (fp8 off
    the GPU always takes the second way: its CPU path computes from dequantized operands.)"""
    from sglang.srt.layers.activation import silu_and_mul
    from sglang.srt.layers.decode_gemm import kernel
    from sglang.srt.layers.decode_gemm.table import shape_key
    from sglang.srt.layers.linear import MergedColumnParallelLinear, attach_gemm_plans

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    layer = MergedColumnParallelLinear(64, [40, 40], params_dtype=dtype, quantization="fp8" if fp8 else None)
    layer = layer.to(device)
    g = torch.Generator().manual_seed(5)
    for shard in (0, 1):
        layer.weight_loader(layer.weight, torch.randn(40, 64, generator=g).to(device, dtype), shard)
    config = {**CFG, "block_n": 64, "block_k": 64} if fp8 else CFG  # fp8 wgmma wants BLOCK_N >= 64
    plans = parse_table({"shapes": {shape_key(80, 64, fp8, silu_and_mul=True): {"4": config}}})
    assert attach_gemm_plans(layer, plans) == 1  # counted: its silu plan uses the skinny kernel
    assert layer.gemm_plan is CUBLAS_ONLY and layer.silu_plan.config_for(4) == GemmConfig(**config)
    fused_rows = []
    real = kernel.skinny_linear
    monkeypatch.setattr(kernel, "skinny_linear", lambda x, *a, **kw: fused_rows.append(x.shape[0]) or real(x, *a, **kw))
    for rows in (3, 5):
        x = torch.randn(rows, 64, generator=g).to(device, dtype)
        out = layer.silu_and_mul(x)
        ref = silu_and_mul(layer(x).double())
        assert out.shape == (rows, 40) and out.dtype == dtype
        assert (out.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
    assert fused_rows == ([] if fp8 and device == "cpu" else [3])
    with pytest.raises(ValueError, match="two equal"):
        MergedColumnParallelLinear(64, [40, 24]).silu_and_mul(torch.randn(1, 64))


@pytest.mark.parametrize("device", DEVICES)
def test_row_parallel_add_norm_runs_in_the_sum_kernel_where_its_plan_splits_k(device, monkeypatch):
    """``forward_add_norm(x, residual, norm)`` = ``norm(layer(x), residual)``: through the sum kernel for the
    row counts whose config splits K, else the GEMM (cuBLAS, or a split-1 skinny config) then the norm."""
    from sglang.srt.layers.decode_gemm import kernel
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.linear import NormInto, RowParallelLinear

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(13)
    layer = RowParallelLinear(96, 48, params_dtype=dtype).to(device)
    layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=g).to(device, dtype))
    norm = RMSNorm(48, eps=1e-5, params_dtype=dtype).to(device)
    norm.weight.data.copy_((torch.rand(48, generator=g) + 0.5).to(device, dtype))
    layer.gemm_plan = GemmPlan(((2, GemmConfig(**CFG, split_k=2)), (4, GemmConfig(**CFG))))  # 3-4 rows: split 1
    fused = []
    real = kernel.skinny_linear
    monkeypatch.setattr(
        kernel, "skinny_linear", lambda *a, **kw: fused.append(kw.get("add_norm") is not None) or real(*a, **kw)
    )
    for rows in (2, 3, 6):  # split-K, split 1, cuBLAS
        x = torch.randn(rows, 96, generator=g).to(device, dtype)
        residual = torch.randn(rows, 48, generator=g).to(device, dtype)
        expected = [t.clone() for t in norm(layer(x), residual.clone())]
        got = layer.forward_add_norm(x, residual.clone(), NormInto(norm, None))
        for out, ref in zip(got, expected):
            assert out.shape == (rows, 48)
            if device == "cpu":  # the torch norm against the kernel's (interpreted): fp32 rounding apart
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(out, ref)
    assert fused == [False, True, False, False]  # reference then fused at 2 rows; split 1 at 3 (both); 6: cuBLAS


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("pdl", [False, True])
def test_skinny_linear_in_a_cuda_graph_waits_for_the_kernel_before(pdl):
    """In the graph, RMSNorm writes x and releases the GEMM early (pdl.py); with PDL the GEMM starts
    streaming weights at once and must still read the x this replay's norm wrote."""
    from sglang.srt.layers.fused_elementwise import rmsnorm

    src = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    norm_weight = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.empty_like(src)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    cfg = GemmConfig(block_m=16, block_n=32, block_k=256, num_warps=4, num_stages=3, split_k=2, pdl=pdl)
    rmsnorm(src, norm_weight, 1e-6, out=x)
    skinny_linear(x, w, None, cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rmsnorm(src, norm_weight, 1e-6, out=x)
        captured = skinny_linear(x, w, None, cfg)
    for seed in range(3):
        src.copy_(torch.randn(src.shape, generator=torch.Generator().manual_seed(seed)).to(src))
        graph.replay()
        torch.cuda.synchronize()
        expected_x = rmsnorm(src, norm_weight, 1e-6)
        assert torch.equal(captured, skinny_linear(expected_x, w, None, cfg))  # fixed-order sums: bitwise
        _check(captured, _reference(expected_x, w, None), torch.bfloat16)


def test_prefetch_columns_share_the_budget_and_keep_16_byte_units(monkeypatch):
    """Without PDL nothing is prefetched; a weight within the budget is prefetched whole (each program its K range),
    a larger one the same fraction of every range, cut to 16 columns; a row whose start or length is not a multiple
    of 16 bytes is not prefetched."""
    monkeypatch.setattr(gemm_kernel, "L2_PREFETCH_BYTES", 1024 * 1024)
    small = torch.empty(256, 1024, dtype=torch.float8_e4m3fn)  # 256 KiB: whole
    big = torch.empty(4096, 1024, dtype=torch.bfloat16)  # 8 MiB: 1/8 of each range
    assert prefetch_columns(small, 512, use_pdl=False) == 0
    assert prefetch_columns(small, 512, use_pdl=True) == 512
    assert prefetch_columns(big, 1024, use_pdl=True) == 128
    assert prefetch_columns(big, 200, use_pdl=True) == 16  # 25 columns, cut to a multiple of 16
    odd_rows = torch.empty(64, 1000, dtype=torch.bfloat16)[:, :999]  # 1998-byte rows
    assert prefetch_columns(odd_rows, 999, use_pdl=True) == 0
    monkeypatch.setattr(gemm_kernel, "L2_PREFETCH_BYTES", 0)
    assert prefetch_columns(small, 512, use_pdl=True) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("block_fp8", [False, True])
def test_l2_prefetch_changes_no_bit_of_the_product(monkeypatch, split_k, block_fp8):
    """With PDL the GEMM asks L2 for its weight rows before it waits (a hint, never a load): the product is the same
    bits with the whole weight prefetched, a part of it (the last split's range cut at K) and none."""
    from sglang.srt.layers.quantization.fp8_block_kernels import quantize_groups

    g = torch.Generator().manual_seed(split_k)
    k = 1408 if block_fp8 else 1000  # the last split's range runs past K
    x = torch.randn(4, k, generator=g).to("cuda", torch.bfloat16)
    w = (torch.randn(384, k, generator=g) / 32).to("cuda", torch.bfloat16)
    cfg = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3, split_k=split_k, pdl=True)
    if block_fp8:
        qx, x_scale = quantize_groups(x)
        qw = w.to(torch.float8_e4m3fn)
        w_scale = torch.rand(3, 11, generator=g).to("cuda") + 0.5
        run = lambda: skinny_linear(qx, qw, None, cfg, block_scales=(x_scale, w_scale, torch.bfloat16))  # noqa: E731
        weight = qw
    else:
        run = lambda: skinny_linear(x, w, None, cfg)  # noqa: E731
        weight = w
    outs = []
    for budget in (0, weight.numel() * weight.element_size() // 3, 1 << 30):
        monkeypatch.setattr(gemm_kernel, "L2_PREFETCH_BYTES", budget)
        assert (prefetch_columns(weight, cfg.k_split(k)[1], True) > 0) == (budget > 0)
        outs.append(run())
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def _shipped_entries() -> list:
    """Every skinny config of every shipped device table (``configs/*.json``), with the weight shape and batch
    size it was tuned for."""
    params = []
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.json"))):
        with open(path) as f:
            shapes = json.load(f)["shapes"]
        device = os.path.basename(path).removesuffix(".json")
        params += [
            pytest.param(key, int(batch), GemmConfig(**config), id=f"{device}-{key}-b{batch}")
            for key, entries in shapes.items()
            for batch, config in entries.items()
            if config is not None
        ]
    return params


def test_a_table_ships_for_each_tuned_device():
    """The H200's and the H100's tables are in the package, so _shipped_entries has something to check."""
    names = {os.path.basename(p) for p in glob.glob(os.path.join(CONFIG_DIR, "*.json"))}
    assert {"NVIDIA_H200.json", "NVIDIA_H100_80GB_HBM3.json"} <= names
    for name in names:
        assert load_device_table(name.removesuffix(".json").replace("_", " "))


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("key,batch,config", _shipped_entries())
def test_every_shipped_config_computes_its_shape(key, batch, config):
    """The tuner times configs on their real shapes; this checks what each chosen one computes there (ragged
    tiles, K splits, the SiLU-and-mul epilogue, fp8 scales, block-fp8 scales) against a float64 product."""
    from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod
    from sglang.srt.layers.quantization.fp8_block_linear import block_fp8_matmul_reference, quantize_groups_reference
    from sglang.srt.layers.quantization.fp8_linear import quantize_rows

    dims, *flags = key.split(":")
    n, k = map(int, dims.split("x"))
    g = torch.Generator(device="cuda").manual_seed(n + k + batch)
    x = torch.randn(batch, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    silu = "silu" in flags
    if "fp8block" in flags:
        (qx, sx), (qw, sw) = quantize_groups_reference(x), Fp8FusedMoEMethod().quantize(w)
        out = skinny_linear(qx, qw, None, config, block_scales=(sx, sw, torch.bfloat16))
        ref = block_fp8_matmul_reference(qx, sx, qw, sw).double()
    elif "fp8" in flags:
        (qx, sx), (qw, sw) = quantize_rows(x), quantize_rows(w)
        out = skinny_linear(qx, qw, None, config, scales=(sx, sw, torch.bfloat16), silu_and_mul=silu)
        ref = _reference(qx.double() * sx.double(), qw.double() * sw.double(), None)
    else:
        x, w = x.bfloat16(), w.bfloat16()
        out = skinny_linear(x, w, None, config, silu_and_mul=silu)
        ref = _reference(x, w, None)
    _check(out, _silu_and_mul_reference(ref) if silu else ref, torch.bfloat16, relative=silu)
