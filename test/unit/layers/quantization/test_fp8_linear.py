"""Online fp8 quantization of dense linear layers (``--quantization fp8``): per-row weight scales,
per-token activation scales, and the scaled GEMM equal to the dequantized product."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.quantization.fp8_linear import FP8_DTYPE, FP8_MAX, fp8_linear, quantize_rows
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, triton_test_devices

TRITON_DEVICES = triton_test_devices()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)),
]


def test_quantize_rows_scales_each_row_to_the_fp8_range():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=g) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 1.0, 1.0])[:, None]
    x[3] = 0.0  # an all-zero row must not divide by zero
    q, scale = quantize_rows(x)
    assert q.dtype == FP8_DTYPE and scale.shape == (6, 1) and scale.dtype == torch.float32
    assert torch.isfinite(q.float()).all()
    # Every non-zero row uses the full range: its largest magnitude maps to 448.
    for r in (0, 1, 2, 4, 5):
        assert q[r].float().abs().max().item() == FP8_MAX
    assert torch.equal(q[3].float(), torch.zeros(40))
    # e4m3 keeps 3 mantissa bits: each value within half a step (1/16 relative) of the original.
    back = q.float() * scale
    assert ((back - x).abs() <= x.abs() / 16 + scale * 2**-9).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_linear_equals_the_product_of_the_dequantized_operands(device, with_bias):
    g = torch.Generator().manual_seed(1)
    m, n, k = 7, 48, 64  # _scaled_mm needs K and N multiples of 16; M is free
    x = (torch.randn(m, k, generator=g) * 2).to(device, torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / 8).to(device, torch.bfloat16)
    bias = torch.randn(n, generator=g).to(device, torch.bfloat16) if with_bias else None
    qw, sw = quantize_rows(w)
    got = fp8_linear(x, qw, sw, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    qx, sx = quantize_rows(x)
    want = F.linear(qx.float() * sx, qw.float() * sw, None if bias is None else bias.float())
    # Same operands, fp32 accumulation in both; only the bf16 rounding of the output differs.
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    # And the whole quantization error against the bf16 layer stays at the few-percent level of e4m3.
    exact = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert (got.float() - exact).norm() / exact.norm() < 0.05


def test_fp8_linear_keeps_leading_dims():
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    qw, sw = quantize_rows(torch.randn(16, 32))
    assert fp8_linear(x, qw, sw, None).shape == (2, 3, 16)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("cols", [64, 4096, 14336])
def test_activation_kernel_equals_quantize_rows(device, cols):
    """Bit for bit, in the interpreter too (whose own float8 conversion rounds wrongly: fp8_tile.py)."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(9, cols, generator=g) * 5).to(device, torch.bfloat16 if device == "cuda" else torch.float32)
    x[4] = 0.0
    from sglang.srt.layers.quantization.fp8_activation_kernel import quantize_activations

    q, scale = quantize_activations(x)
    want_q, want_scale = quantize_rows(x)
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


def _same_fp8(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_linear_loaders_quantize_each_shards_rows_as_it_arrives():
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    g = torch.Generator().manual_seed(3)
    gate, up = torch.randn(48, 32, generator=g), torch.randn(16, 32, generator=g) * 5
    merged = MergedColumnParallelLinear(32, [48, 16], params_dtype=torch.float32, quantization="fp8")
    assert merged.weight.dtype == FP8_DTYPE and merged.is_fp8
    merged.weight_loader(merged.weight, up, 1)  # any order
    merged.weight_loader(merged.weight, gate, 0)
    want_q, want_scale = quantize_rows(torch.cat([gate, up]))
    assert _same_fp8(merged.weight, want_q) and torch.equal(merged.weight_scale, want_scale)

    # A row-parallel shard scales its own slice of K (o_proj's rank takes its heads' columns).
    full = torch.randn(16, 64, generator=g)
    full[:, :16] *= 100  # outside this rank's columns: must not set its scales
    row = RowParallelLinear(64, 16, params_dtype=torch.float32, input_range=(16, 48), quantization="fp8")
    row.weight_loader(row.weight, full)
    want_q, want_scale = quantize_rows(full[:, 16:48])
    assert _same_fp8(row.weight, want_q) and torch.equal(row.weight_scale, want_scale)

    # q, k, v land in their rows; the bias stays full precision; forward = the dequantized product.
    qkv = QKVParallelLinear(32, 8, 4, 2, bias=True, params_dtype=torch.float32, quantization="fp8")
    parts = {"q": torch.randn(32, 32, generator=g), "k": torch.randn(16, 32, generator=g), "v": torch.randn(16, 32)}
    for shard in ("v", "q", "k"):
        qkv.weight_loader(qkv.weight, parts[shard], shard)
        qkv.weight_loader(qkv.bias, torch.arange(16.0) if shard != "q" else torch.arange(32.0), shard)
    assert qkv.bias.dtype == torch.float32
    x = torch.randn(3, 32, generator=g)
    w = torch.cat([parts["q"], parts["k"], parts["v"]])
    qw, sw = quantize_rows(w)
    qx, sx = quantize_rows(x)
    want = F.linear(qx.float() * sx, qw.float() * sw, qkv.bias)
    torch.testing.assert_close(qkv(x), want, rtol=1e-5, atol=1e-5)


def test_a_misshapen_shard_is_refused_before_anything_is_stored():
    from sglang.srt.layers.linear import ColumnParallelLinear

    layer = ColumnParallelLinear(32, 16, params_dtype=torch.float32, quantization="fp8")
    before = layer.weight_scale.clone()
    with pytest.raises(ValueError, match="does not fit"):
        layer.weight_loader(layer.weight, torch.randn(16, 31))
    assert torch.equal(layer.weight_scale, before)
    with pytest.raises(ValueError, match="quantization"):
        ColumnParallelLinear(32, 16, quantization="int4")
