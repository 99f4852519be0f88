"""A norm or SiLU-and-mul hands a block-fp8 projection after it its output quantized (``NormInto``,
``MergedColumnParallelLinear.silu_and_mul(into=)``): the decoder's pieces give the same products as with the bf16
tensors in between (CPU: the torch reference of every step; the kernels' own bits are in test_fused_elementwise.py
and decode_gemm/test_decode_gemm.py, the whole models on the GPU in test_fp8_checkpoints_gpu.py)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import torch

from sglang.srt.layers.activation import silu_and_mul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import LinearBase, NormInto, QKVParallelLinear
from sglang.srt.layers.quantization.block_fp8_activation import ROW_MAJOR, BlockFp8Activation
from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod
from sglang.srt.models.llama import LlamaMLP

HIDDEN, INTERMEDIATE = 256, 384


def _fill(layer: LinearBase, g: torch.Generator) -> LinearBase:
    """Random weights: block-fp8 codes and 128x128 scales for a block-fp8 layer, else plain."""
    w = torch.randn(layer.weight.shape, generator=g) / 8
    if layer.is_block_fp8:
        q, scale = Fp8FusedMoEMethod().quantize(w)
        layer.weight.data.copy_(q)
        layer.weight_scale_inv.data.copy_(scale)
    else:
        layer.weight.data.copy_(w)
    return layer


def _norm(g: torch.Generator) -> RMSNorm:
    norm = RMSNorm(HIDDEN, eps=1e-6, params_dtype=torch.float32)
    norm.weight.data.copy_(torch.rand(HIDDEN, generator=g) + 0.5)
    return norm


def _qkv(quantization, g: torch.Generator) -> QKVParallelLinear:
    return _fill(QKVParallelLinear(HIDDEN, 64, 4, 2, params_dtype=torch.float32, quantization=quantization), g)


def test_norm_into_a_block_fp8_projection_hands_it_the_norm_quantized():
    g = torch.Generator().manual_seed(1)
    norm, qkv = _norm(g), _qkv("fp8_block", g)
    x, residual = torch.randn(3, HIDDEN, generator=g), torch.randn(3, HIDDEN, generator=g)
    assert qkv.input_quantization(x) == ROW_MAJOR
    want, want_residual = norm(x, residual.clone())
    got, got_residual = NormInto(norm, qkv)(x, residual.clone())
    assert isinstance(got, BlockFp8Activation) and got.rows == 3
    assert torch.equal(got_residual, want_residual) and torch.equal(qkv(got), qkv(want))
    first_layer = NormInto(norm, qkv)(x)  # no residual (the embeddings): the norm alone
    assert isinstance(first_layer, BlockFp8Activation) and torch.equal(qkv(first_layer), qkv(norm(x)))
    # A full-precision projection, or none (the lm_head reads the final norm): the norm as it is.
    for projection in (_qkv(None, g), None):
        plain, _ = NormInto(norm, projection)(x, residual.clone())
        assert isinstance(plain, torch.Tensor) and torch.equal(plain, want)


def test_block_fp8_mlp_hands_down_proj_its_activation_and_the_next_qkv_its_norm_quantized(monkeypatch):
    g = torch.Generator().manual_seed(2)
    mlp = LlamaMLP(HIDDEN, INTERMEDIATE, torch.float32, quantization="fp8_block")
    _fill(mlp.gate_up_proj, g), _fill(mlp.down_proj, g)
    next_norm, next_qkv = _norm(g), _qkv("fp8_block", g)
    x, residual = torch.randn(4, HIDDEN, generator=g), torch.randn(4, HIDDEN, generator=g)
    # The same steps with bf16-style tensors in between: gate_up, the activation, down, the add and norm.
    want, want_residual = next_norm(mlp.down_proj(silu_and_mul(mlp.gate_up_proj(x))), residual.clone())
    down_inputs = []
    real_matmul = mlp.down_proj.matmul
    monkeypatch.setattr(mlp.down_proj, "matmul", lambda a, bias: down_inputs.append(type(a)) or real_matmul(a, bias))
    got, got_residual = mlp.forward_add_norm(x, residual.clone(), NormInto(next_norm, next_qkv))
    assert down_inputs == [BlockFp8Activation]  # SiLU-and-mul handed down_proj its output quantized
    assert isinstance(got, BlockFp8Activation)  # and the norm after down, the next qkv_proj its input
    assert torch.equal(got_residual, want_residual) and torch.equal(next_qkv(got), next_qkv(want))
