"""Write one layer's new K and V rows into the pool in a single kernel.

``k_buffer[loc[t]] = k[t]`` and ``v_buffer[loc[t]] = v[t]`` as two torch index_puts are two kernels
per layer (plus their launch gaps), 64 of a Llama-3.1-8B decode step's ~470. One program per token
copies both rows. Used on CUDA when the new rows are already in the pool's dtype and each token's
heads are contiguous (the qkv projection's K/V views are); everything else takes the torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    K,
    V,
    K_Buf,
    V_Buf,
    Loc,
    stride_k,
    stride_v,
    stride_kb,
    stride_vb,
    ROW_K: tl.constexpr,
    ROW_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(Loc + t).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    k = tl.load(K + t * stride_k + offs_k, mask=offs_k < ROW_K)
    tl.store(K_Buf + slot * stride_kb + offs_k, k, mask=offs_k < ROW_K)
    offs_v = tl.arange(0, BLOCK_V)
    v = tl.load(V + t * stride_v + offs_v, mask=offs_v < ROW_V)
    tl.store(V_Buf + slot * stride_vb + offs_v, v, mask=offs_v < ROW_V)


def _rows_contiguous(x: torch.Tensor) -> bool:
    """[T, H, D] whose H x D elements of each token are one contiguous run."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def can_store_kv_fused(k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> bool:
    return (
        k.dtype == k_buffer.dtype
        and v.dtype == v_buffer.dtype
        and all(_rows_contiguous(x) for x in (k, v, k_buffer, v_buffer))
        and k.shape[1:] == k_buffer.shape[1:]
        and v.shape[1:] == v_buffer.shape[1:]
    )


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor
) -> None:
    """k [T, Hkv, D], v [T, Hkv, Dv] into k_buffer/v_buffer [slots, Hkv, D/Dv] at loc [T] (any int dtype)."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    row_k, row_v = k.shape[1] * k.shape[2], v.shape[1] * v.shape[2]
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_buffer,
        v_buffer,
        loc,
        k.stride(0),
        v.stride(0),
        k_buffer.stride(0),
        v_buffer.stride(0),
        ROW_K=row_k,
        ROW_V=row_v,
        BLOCK_K=triton.next_power_of_2(row_k),
        BLOCK_V=triton.next_power_of_2(row_v),
    )
