"""Packing and grouping helpers shared by the weight quantization methods (torch only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad_to_multiple(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """Zero-pad ``dim`` up to a multiple; zeros never change a group's absolute max."""
    extra = cdiv(x.shape[dim], multiple) * multiple - x.shape[dim]
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [0, extra]
    return F.pad(x, pad)


def group_last_dim(x: torch.Tensor, group: int) -> torch.Tensor:
    """[R, C] -> [R, ceil(C / group), group], zero-padding the ragged last group."""
    padded = pad_to_multiple(x, -1, group)
    return padded.view(x.shape[0], -1, group)


def expand_groups(scale: torch.Tensor, group: int, cols: int) -> torch.Tensor:
    """[R, G] per-group values -> [R, cols], each repeated over its group."""
    return scale.repeat_interleave(group, dim=-1)[..., :cols]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] values in 0..15 -> [..., K // 2] uint8; element 2j in the low nibble, 2j+1 high.

    Low-nibble-first along K lets the kernel decode element k as (byte[k // 2] >> 4 * (k % 2)) & 15.
    """
    if codes.shape[-1] % 2:
        raise ValueError("nibble packing needs an even number of elements along the last dim")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: [..., K // 2] uint8 -> [..., K] uint8 in 0..15."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


# OCP FP4 (e2m1) magnitudes by 3-bit code (exp = code >> 1, mantissa = code & 1); bit 3 is the sign.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E8M0_BIAS = 127


def e2m1_decode_table(device: torch.device | str | None = None) -> torch.Tensor:
    """float32 [16]: the value of each 4-bit e2m1 code."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat((mags, -mags))


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round float values (already divided by their block scale) to the nearest e2m1 code (uint8)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=x.device)
    midpoints = (mags[1:] + mags[:-1]) / 2
    code = torch.bucketize(x.abs().clamp(max=E2M1_MAX), midpoints)
    return (code | torch.where(x < 0, 8, 0)).to(torch.uint8)


def e8m0_to_float(exponent: torch.Tensor) -> torch.Tensor:
    """uint8 biased exponents -> float32 2**(e - 127), built from the bits as the kernel does.

    Code 0 comes out as 0.0 rather than the subnormal 2**-127; only all-zero blocks use it.
    """
    return (exponent.to(torch.int32) << 23).view(torch.float32)
