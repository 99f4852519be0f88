"""fp8 (e4m3) quantization of a tile inside a triton kernel: one scale per row of the tile, the arithmetic of
``fp8_linear.quantize_rows`` / ``fp8_block_linear.quantize_groups_reference`` to the bit.

The activation kernels (per token: ``fp8_activation_kernel.py``; per token and 128-column group:
``fp8_block_kernels.py``) share it, and so do the kernels that quantize their own output for a block-fp8
projection after them (``store_quantized_groups``: RMSNorm, SiLU-and-mul, the skinny GEMM's split-K add-norm), so
none of them can round apart.

The triton interpreter (the CPU tests) converts float32 to float8 wrongly: where rounding carries into the next power
of two (124.3 -> 64 instead of 128) and below e4m3's smallest normal (2^-6, rounded down). There the value is first
rounded to e4m3's grid by hand, exactly as the GPU's conversion rounds (to nearest, ties to even), so the conversion
has nothing left to round; the GPU converts directly (``cvt.rn.satfinite``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang.srt.layers.quantization.fp8 import FP8_BLOCK, FP8_MAX, INV_FP8_MAX, MIN_SCALE

_GROUP: tl.constexpr = tl.constexpr(FP8_BLOCK)
_FP8_MAX: tl.constexpr = tl.constexpr(FP8_MAX)
_INV_FP8_MAX: tl.constexpr = tl.constexpr(INV_FP8_MAX)
_MIN_SCALE: tl.constexpr = tl.constexpr(MIN_SCALE)
_E4M3_MIN_NORMAL: tl.constexpr = tl.constexpr(2.0**-6)
_E4M3_SUBNORMAL_STEP: tl.constexpr = tl.constexpr(2.0**-9)  # subnormals are whole multiples of it
# float32 keeps 23 mantissa bits, e4m3 3: rounding drops the low 20, to nearest with ties to even.
_DROPPED_HALF_MINUS_ONE: tl.constexpr = tl.constexpr((1 << 19) - 1)
_KEPT_BITS_MASK: tl.constexpr = tl.constexpr(-(1 << 20))
_SIGN_BIT: tl.constexpr = tl.constexpr(-(1 << 31))


@triton.jit
def _round_to_e4m3_grid(v):
    """float32 v with |v| <= 448 -> the nearest e4m3 value (ties to even), still float32."""
    bits = v.to(tl.int32, bitcast=True)
    # Normal range: add just under half of the dropped bits' weight (plus the kept lowest bit, for ties to even),
    # then drop them; a carry out of the mantissa moves into the exponent, as it should.
    normal = ((bits + _DROPPED_HALF_MINUS_ONE + ((bits >> 20) & 1)) & _KEPT_BITS_MASK).to(tl.float32, bitcast=True)
    # Subnormal range: a whole number of 2^-9 steps (dividing and multiplying by a power of two is exact).
    steps = tl.abs(v) / _E4M3_SUBNORMAL_STEP
    whole = steps.to(tl.int32)  # truncated: steps >= 0
    rest = steps - whole.to(tl.float32)
    up = (rest > 0.5) | ((rest == 0.5) & ((whole & 1) == 1))
    subnormal = (whole + up.to(tl.int32)).to(tl.float32) * _E4M3_SUBNORMAL_STEP
    subnormal = (subnormal.to(tl.int32, bitcast=True) | (bits & _SIGN_BIT)).to(tl.float32, bitcast=True)  # -0 too
    return tl.where(tl.abs(v) < _E4M3_MIN_NORMAL, subnormal, normal)


@triton.jit
def quantize_tile_rows(x, fp8_dtype: tl.constexpr, ROUND_BY_HAND: tl.constexpr):
    """x: a float32 tile [R, C] -> (q [R, C] in fp8_dtype, scale [R] float32) with x ~= q * scale per row:
    scale = max(amax(|row|) / 448, 1e-12) (times the reciprocal), q = x / scale correctly rounded, clamped."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) * _INV_FP8_MAX, _MIN_SCALE)
    # tl.math.div_rn: triton's `/` is approximate, torch's division is not.
    v = tl.clamp(tl.math.div_rn(x, scale[:, None]), -_FP8_MAX, _FP8_MAX)
    if ROUND_BY_HAND:
        v = _round_to_e4m3_grid(v)
    return v.to(fp8_dtype), scale


@triton.jit
def store_quantized_groups(
    v,
    first_group,
    n_cols,
    q_row_ptr,
    scale_row_ptr,
    stride_scale_group,
    BLOCK: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    """One row's float32 values ``v`` [BLOCK] (BLOCK a power of two >= 128), the row's columns from
    ``first_group * 128``, quantized per 128-column group: the codes stored at ``q_row_ptr + column`` (columns below
    n_cols), each group's scale at ``scale_row_ptr + group * stride_scale_group`` (groups that hold a column). Values
    past n_cols must be 0: they pad the ragged last group, as the reference pads it."""
    GROUPS: tl.constexpr = BLOCK // _GROUP
    q, scale = quantize_tile_rows(tl.reshape(v, (GROUPS, _GROUP)), q_row_ptr.dtype.element_ty, ROUND_BY_HAND)
    cols = first_group * _GROUP + tl.arange(0, BLOCK)
    tl.store(q_row_ptr + cols, tl.reshape(q, (BLOCK,)), mask=cols < n_cols)
    groups = first_group + tl.arange(0, GROUPS)
    tl.store(scale_row_ptr + groups * stride_scale_group, scale, mask=groups * _GROUP < n_cols)
