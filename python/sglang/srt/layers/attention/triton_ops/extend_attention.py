"""Extend (prefill with a cached prefix) attention over a token-major paged KV pool.

Request ``i`` of the batch has:
  * new tokens ``q_extend[qo_indptr[i]:qo_indptr[i+1]]`` (their K/V at the same rows of
    ``k_extend [N, Hkv, D]`` / ``v_extend [N, Hkv, Dv]``), and
  * a cached prefix whose pool slots are ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` in
    ``k_buffer [num_slots, Hkv, D]`` / ``v_buffer [num_slots, Hkv, Dv]`` (may be empty).

New token ``j`` attends to every prefix token and (causal) to new tokens ``0..j``; the causal
diagonal is therefore offset by the prefix length, which is why the two parts are walked as two
loops of one online softmax: the prefix through the slot indirection with no mask, then the new
tokens straight from ``k_extend``/``v_extend`` (no need for them to be in the pool yet) with the
causal mask. One program handles ``BLOCK_M`` new tokens of one q head; both products use
``tl.dot`` with fp32 accumulation. Lengths are read on the device; ``max_len_extend`` (host int)
only sizes the grid.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.decode_attention import _attend_kv_block
from sglang.srt.layers.kernel_dispatch import in_interpreter


@triton.jit
def _extend_fwd_kernel(
    Q,
    K_Ext,
    V_Ext,
    O,  # noqa: E741 - the attention output, named as in the papers
    K_Buf,
    V_Buf,
    Qo_Indptr,
    Kv_Indptr,
    Kv_Indices,
    sm_scale,
    logit_cap,
    sliding_window,
    k_scale,
    v_scale,
    stride_qn,
    stride_qh,
    stride_ken,
    stride_keh,
    stride_ven,
    stride_veh,
    stride_on,
    stride_oh,
    stride_kbn,
    stride_kbh,
    stride_vbn,
    stride_vbh,
    kv_group_num: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    USE_CAP: tl.constexpr,
    WHILE_LOOPS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    V_SCALED: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    # Causal q blocks further down a sequence do more work: hand those out first (less tail).
    m_blk = tl.num_programs(2) - 1 - tl.program_id(2)
    kv_head = h // kv_group_num

    q_start = tl.load(Qo_Indptr + b).to(tl.int64)
    ext_len = (tl.load(Qo_Indptr + b + 1) - tl.load(Qo_Indptr + b)).to(tl.int32)
    pre_start = tl.load(Kv_Indptr + b)
    pre_len = (tl.load(Kv_Indptr + b + 1) - pre_start).to(tl.int32)

    if m_blk * BLOCK_M < ext_len:
        offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_m = offs_m < ext_len
        mask_d = offs_d < D
        mask_dv = offs_dv < DV
        rows = q_start + offs_m

        q = tl.load(
            Q + rows[:, None] * stride_qn + h * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)  # finite: no (-inf) - (-inf)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

        # Last new-token column this q block can see (+1).
        if IS_CAUSAL:
            ext_end = tl.minimum(ext_len, (m_blk + 1) * BLOCK_M)
        else:
            ext_end = ext_len
        # With a window, new token m (position pre_len + m) sees keys at positions > pre_len + m - window:
        # columns left of what the block's first row sees are skipped, the rest masked per row.
        pre_lo = 0
        ext_lo = 0
        if USE_WINDOW:
            pre_lo = tl.maximum(pre_len + m_blk * BLOCK_M - sliding_window + 1, 0)
            ext_lo = tl.maximum(m_blk * BLOCK_M - sliding_window + 1, 0)

        # A cache with the checkpoint's KV scales holds k / k_scale and v / v_scale: the prefix's scores take
        # sm_scale x k_scale and its probabilities x V take v_scale; the new tokens' K/V are as computed.
        # Loop bodies are written once per loop form (see kernel_dispatch):
        # 1) the cached prefix through the slot indirection, every valid column visible;
        # 2) the new tokens straight from k_extend / v_extend, causally masked.
        if WHILE_LOOPS:
            n0 = pre_lo
            while n0 < pre_len:
                mask_n = n0 + offs_n < pre_len
                mask_qk = mask_n[None, :]
                if USE_WINDOW:
                    mask_qk = mask_qk & (n0 + offs_n[None, :] > pre_len + offs_m[:, None] - sliding_window)
                slot = tl.load(Kv_Indices + pre_start + n0 + offs_n, mask=mask_n, other=0)
                acc, m_i, l_i = _attend_kv_block(
                    acc,
                    m_i,
                    l_i,
                    q,
                    K_Buf,
                    V_Buf,
                    slot.to(tl.int64),
                    mask_n,
                    mask_qk,
                    kv_head,
                    stride_kbn,
                    stride_kbh,
                    stride_vbn,
                    stride_vbh,
                    offs_d,
                    offs_dv,
                    mask_d,
                    mask_dv,
                    sm_scale * k_scale,
                    logit_cap,
                    USE_CAP,
                    v_scale,
                    V_SCALED,
                )
                n0 += BLOCK_N
            n0 = ext_lo
            while n0 < ext_end:
                cols = n0 + offs_n
                mask_n = cols < ext_len
                mask_qk = mask_n[None, :]
                if IS_CAUSAL:
                    mask_qk = mask_qk & (offs_m[:, None] >= cols[None, :])
                if USE_WINDOW:
                    mask_qk = mask_qk & (cols[None, :] > offs_m[:, None] - sliding_window)
                acc, m_i, l_i = _attend_kv_block(
                    acc,
                    m_i,
                    l_i,
                    q,
                    K_Ext,
                    V_Ext,
                    q_start + cols,
                    mask_n,
                    mask_qk,
                    kv_head,
                    stride_ken,
                    stride_keh,
                    stride_ven,
                    stride_veh,
                    offs_d,
                    offs_dv,
                    mask_d,
                    mask_dv,
                    sm_scale,
                    logit_cap,
                    USE_CAP,
                    1.0,
                    False,
                )
                n0 += BLOCK_N
        else:
            for n0 in range(pre_lo, pre_len, BLOCK_N):
                mask_n = n0 + offs_n < pre_len
                mask_qk = mask_n[None, :]
                if USE_WINDOW:
                    mask_qk = mask_qk & (n0 + offs_n[None, :] > pre_len + offs_m[:, None] - sliding_window)
                slot = tl.load(Kv_Indices + pre_start + n0 + offs_n, mask=mask_n, other=0)
                acc, m_i, l_i = _attend_kv_block(
                    acc,
                    m_i,
                    l_i,
                    q,
                    K_Buf,
                    V_Buf,
                    slot.to(tl.int64),
                    mask_n,
                    mask_qk,
                    kv_head,
                    stride_kbn,
                    stride_kbh,
                    stride_vbn,
                    stride_vbh,
                    offs_d,
                    offs_dv,
                    mask_d,
                    mask_dv,
                    sm_scale * k_scale,
                    logit_cap,
                    USE_CAP,
                    v_scale,
                    V_SCALED,
                )
            for n0 in range(ext_lo, ext_end, BLOCK_N):
                cols = n0 + offs_n
                mask_n = cols < ext_len
                mask_qk = mask_n[None, :]
                if IS_CAUSAL:
                    mask_qk = mask_qk & (offs_m[:, None] >= cols[None, :])
                if USE_WINDOW:
                    mask_qk = mask_qk & (cols[None, :] > offs_m[:, None] - sliding_window)
                acc, m_i, l_i = _attend_kv_block(
                    acc,
                    m_i,
                    l_i,
                    q,
                    K_Ext,
                    V_Ext,
                    q_start + cols,
                    mask_n,
                    mask_qk,
                    kv_head,
                    stride_ken,
                    stride_keh,
                    stride_ven,
                    stride_veh,
                    offs_d,
                    offs_dv,
                    mask_d,
                    mask_dv,
                    sm_scale,
                    logit_cap,
                    USE_CAP,
                    1.0,
                    False,
                )

        out = acc / l_i[:, None]
        tl.store(
            O + rows[:, None] * stride_on + h * stride_oh + offs_dv[None, :],
            out.to(O.dtype.element_ty),
            mask=mask_m[:, None] & mask_dv[None, :],
        )


def _block_config(d: int, dv: int, on_gpu: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages), tuned for Hopper-class GPUs."""
    if not on_gpu:
        return 32, 32, 4, 1  # interpreter: small tiles keep numpy work low for tiny tests
    # Two warpgroups for a 128-row wgmma tile: at 4 warps D=64 already sits at ~254 regs/thread.
    width = max(d, dv)
    if width <= 128:
        return 128, 64, 8, 2
    if width <= 256:
        return 64, 32, 8, 1
    return 32, 32, 8, 1


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    is_causal: bool = True,
    logit_cap: float = 0.0,
    sliding_window: int = -1,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> None:
    """Attention of the new tokens over (cached prefix + new tokens); writes ``o_extend`` in place.

    ``k_scale`` / ``v_scale``: the checkpoint's KV cache scales, which the prefix's buffers were stored with
    (k / k_scale, v / v_scale); None: the buffers hold K/V as they are.

    ``qo_indptr [bs+1]`` indexes rows of q/k/v/o_extend; ``kv_indptr [bs+1]``/``kv_indices`` give
    each request's prefix slots (prefix only, not the new tokens). ``max_len_extend`` must be
    >= every request's new-token count: it sizes the grid. ``sliding_window`` > 0 (causal only): a new token
    at position p sees the keys at positions p - sliding_window + 1 .. p, transformers' Mistral window.
    """
    assert sliding_window <= 0 or is_causal, "a sliding window is a causal mask"
    n, hq, d = q_extend.shape
    hkv = k_extend.shape[1]
    dv = v_extend.shape[-1]
    assert hq % hkv == 0, f"num_q_heads {hq} not a multiple of num_kv_heads {hkv}"
    assert k_buffer.shape[1] == hkv and k_buffer.shape[-1] == d and v_buffer.shape[-1] == dv
    assert o_extend.shape == (n, hq, dv)
    for t in (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer):
        assert t.stride(-1) == 1, "last dim must be contiguous"
    bs = qo_indptr.shape[0] - 1
    if bs <= 0 or n == 0 or max_len_extend <= 0:
        return
    block_m, block_n, num_warps, num_stages = _block_config(d, dv, q_extend.is_cuda)
    extra = {"num_warps": num_warps, "num_stages": num_stages} if q_extend.is_cuda else {}
    grid = (bs, hq, triton.cdiv(max_len_extend, block_m))
    _extend_fwd_kernel[grid](
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        float(sm_scale),
        float(logit_cap),
        int(sliding_window),
        1.0 if k_scale is None else float(k_scale),
        1.0 if v_scale is None else float(v_scale),
        q_extend.stride(0),
        q_extend.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o_extend.stride(0),
        o_extend.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        kv_group_num=hq // hkv,
        D=d,
        DV=dv,
        # At least 32 wide: triton 3.6 miscompiles the 128x64 tile with a 32-wide Q/K and a 16-wide V block
        # (wrong outputs, out-of-bounds shared-memory reads under compute-sanitizer; H200, 2026-12-03: the
        # MLA extend test's D=24, DV=12). Real heads (64 and up) are unaffected.
        BLOCK_D=max(32, triton.next_power_of_2(d)),
        BLOCK_DV=max(32, triton.next_power_of_2(dv)),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_CAUSAL=bool(is_causal),
        USE_CAP=logit_cap > 0,
        WHILE_LOOPS=in_interpreter(q_extend),
        USE_WINDOW=sliding_window > 0,
        V_SCALED=v_scale is not None,
        **extra,
    )
