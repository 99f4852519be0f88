"""One-kernel triton versions of the decoder's elementwise steps, used on the GPU.

At batch 1 a decode step of an 8B model is ~4 ms of weight reads; written as plain torch ops, RMSNorm,
rotary and SiLU-and-mul cost ~40 tiny kernels per layer and add as much again in launch gaps. Each
function below is one kernel, in place where the data is a temporary. Math is in fp32 with the
reference's roundings at the same points (residual add, normalised value, output); the CPU keeps the
torch versions, which match transformers bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.head_matmul import HeadMatmul, head_matmul_tile
from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue, release_dependents, wait_for_prerequisites
from sglang.srt.layers.quantization.block_fp8_activation import (
    ActivationLayout,
    BlockFp8Activation,
    empty_block_fp8_activation,
)
from sglang.srt.layers.quantization.fp8_tile import store_quantized_groups
from sglang.srt.layers.triton_math import tanh


@triton.jit
def _scale_normed(normed, w, dt: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """A normalised fp32 row times its norm weight, rounded to dt as the family's RMSNorm rounds (returned in fp32):
    Llama's rounds the normalised value first, then the product; Gemma's takes (1 + w) times it in fp32, one rounding."""
    if UNIT_OFFSET:
        return (normed * (1.0 + w)).to(dt).to(tl.float32)
    return (w * normed.to(dt).to(tl.float32)).to(dt).to(tl.float32)


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    out_ptr,
    w_ptr,
    q_ptr,
    qs_ptr,
    n_cols,
    n_rows,
    sx,
    sres,
    so,
    sq,
    sqs_row,
    sqs_group,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    QUANTIZE: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    # Rows past n_rows: QUANTIZE's padding rows (zero codes, the smallest scale), nothing else read or written.
    mask = (cols < n_cols) & (row < n_rows)
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x.to(tl.float32) + tl.load(res_ptr + row * sres + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(res_ptr.dtype.element_ty)  # the reference rounds the sum to the activation dtype
        tl.store(res_ptr + row * sres + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = _scale_normed(xf * tl.rsqrt(var + eps), w, x_ptr.dtype.element_ty, False)
    if QUANTIZE:  # the row as the block-fp8 projection after the norm takes it, not written in x's dtype
        store_quantized_groups(
            out, 0, n_cols, q_ptr + row * sq, qs_ptr + row * sqs_row, sqs_group, BLOCK, ROUND_BY_HAND
        )
    else:
        tl.store(out_ptr + row * so + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    quantize: ActivationLayout | None = None,
) -> torch.Tensor | BlockFp8Activation:
    """norm over the last dim of x [T, D] (strided rows are fine).
    With `residual` ([T, D]): residual += x in place and the result is norm(residual). `out` may be
    x itself (in place); by default a new contiguous tensor. `quantize`: the result handed to the block-fp8
    projection after the norm, quantized per token and 128-column group in that layout (the same bits as the norm's
    output through ``fp8_block_kernels.quantize_groups``), instead of written in x's dtype."""
    if x.dim() != 2:
        raise ValueError(f"rmsnorm normalizes the rows of a 2-D x, got shape {tuple(x.shape)}")
    n_tok, n_cols = x.shape
    if quantize is not None and out is not None:
        raise ValueError("rmsnorm quantizes into buffers of its own (no out)")
    out = torch.empty_like(x) if out is None and quantize is None else out
    o = x if out is None else out  # x: a dummy, never written
    quantized = None if quantize is None else empty_block_fp8_activation(n_tok, n_cols, x.dtype, quantize, x.device)
    q, qs = (quantized.q, quantized.scale) if quantized is not None else (x, x)  # dummies unless quantizing
    res = residual if residual is not None else x
    pdl = pdl_available(x)
    programs = n_tok if quantized is None else q.shape[0]  # padding rows too
    if programs:
        _rmsnorm_kernel[(programs,)](
            x,
            res,
            o,
            weight,
            q,
            qs,
            n_cols,
            n_tok,
            x.stride(0),
            res.stride(0),
            o.stride(0),
            q.stride(0),
            *(qs.stride() if quantized is not None else (0, 0)),
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=max(triton.next_power_of_2(n_cols), 128 if quantized is not None else 1),
            QUANTIZE=quantized is not None,
            ROUND_BY_HAND=in_interpreter(x),
            PDL=pdl,
            launch_pdl=pdl,
            num_warps=4 if n_cols <= 1024 else 8,
        )
    return out if quantized is None else quantized


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    stride_q,
    stride_k,
    stride_qh,
    stride_kh,
    stride_cos,
    num_q_heads,
    num_k_heads,
    v_ptr,
    k_buf,
    v_buf,
    loc_ptr,
    stride_v,
    stride_kb,
    stride_vb,
    v_row,
    vw_ptr,
    v_eps,
    qw_ptr,
    kw_ptr,
    qk_eps,
    n_tokens,
    ax_ptr,
    aw_ptr,
    ay_ptr,
    stride_axt,
    stride_axh,
    stride_awh,
    stride_awk,
    stride_awn,
    stride_ayt,
    stride_ayh,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    STORE_KV: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NORM_V: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    QK_NORM: tl.constexpr,
    QK_UNIT_OFFSET: tl.constexpr,
    ABSORB: tl.constexpr,
    A_K: tl.constexpr,
    A_N: tl.constexpr,
    A_BLOCK_T: tl.constexpr,
    A_BLOCK_N: tl.constexpr,
    A_BLOCK_K: tl.constexpr,
    A_N_BLOCKS: tl.constexpr,
    A_T_BLOCKS: tl.constexpr,
    A_DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    # INTERLEAVED (DeepSeek): the pairs (x_2i, x_2i+1) rotate, and the result is laid out de-interleaved, as
    # rotary_embedding.rotate_pairs writes it (each head's whole row is rotated: no partial rotary).
    # HALF: half the rotating width (rotary_dim / 2; head_dim / 2 unless partial rotary); the features from
    # 2 * HALF to HEAD_DIM pass through (in place: only the pool copy of K needs them written, or their norm).
    # QK_NORM (Qwen3, GLM-4.5): each head's row is RMS-normed first (q by qw, k by kw), rounded as
    # _rmsnorm_kernel rounds it, and the normed row rotates: one kernel where the per-head norms were two more.
    # QK_UNIT_OFFSET (Gemma 3): the scale is (1 + w) and the fp32 product is rounded once, as _gemma_rmsnorm_kernel.
    # ABSORB (MLA decode): programs past the tokens' run head_matmul's tiles of ax @ aw -> ay (the query's nope part
    # through W_UK, which does not rotate): the attention's first kernel then needs no head_matmul launch of its own.
    release_dependents(PDL)
    token = tl.program_id(0)
    if token >= n_tokens:
        if ABSORB:
            tile = token - n_tokens
            head_matmul_tile(
                ax_ptr, aw_ptr, ay_ptr, n_tokens, stride_axt, stride_axh, stride_awh, stride_awk, stride_awn,
                stride_ayt, stride_ayh, tile // (A_N_BLOCKS * A_T_BLOCKS), (tile // A_T_BLOCKS) % A_N_BLOCKS,
                tile % A_T_BLOCKS, A_K, A_N, A_BLOCK_T, A_BLOCK_N, A_BLOCK_K, A_DOT_PRECISION, PDL,
            )  # fmt: skip
    else:
        wait_for_prerequisites(PDL)
        pos = tl.load(pos_ptr + token)
        d = tl.arange(0, BLOCK_HALF)
        in_half = d < HALF
        # cos[:half] == cos[half:]
        cos = tl.load(cos_ptr + pos * stride_cos + d, mask=in_half, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + pos * stride_cos + d, mask=in_half, other=0.0).to(tl.float32)
        heads = tl.arange(0, BLOCK_H)
        if STORE_KV:
            slot = tl.load(loc_ptr + token).to(tl.int64)
        for which in tl.static_range(2):
            if which == 0:
                base, n, stride, stride_h = q_ptr, num_q_heads, stride_q, stride_qh
            else:
                base, n, stride, stride_h = k_ptr, num_k_heads, stride_k, stride_kh
            mask = (heads < n)[:, None] & in_half[None, :]
            offs = token * stride + heads[:, None] * stride_h + d[None, :]
            if INTERLEAVED:
                x1 = tl.load(base + offs + d[None, :], mask=mask, other=0.0).to(tl.float32)  # x[2d]
                x2 = tl.load(base + offs + d[None, :] + 1, mask=mask, other=0.0).to(tl.float32)  # x[2d + 1]
                tl.debug_barrier()  # the row is rewritten in another order: every thread's loads come first
            else:
                x1 = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
                x2 = tl.load(base + offs + HALF, mask=mask, other=0.0).to(tl.float32)
            # Partial rotary: the unrotated tail of each head, read where it is normed or goes to the pool (K).
            if BLOCK_PASS > 0 and (QK_NORM or (STORE_KV and which == 1)):
                p = 2 * HALF + tl.arange(0, BLOCK_PASS)
                pmask = (heads < n)[:, None] & (p < HEAD_DIM)[None, :]
                tail_offs = token * stride + heads[:, None] * stride_h + p[None, :]
                tail = tl.load(base + tail_offs, mask=pmask, other=0.0)
            if QK_NORM:
                dt = base.dtype.element_ty
                w_ptr = qw_ptr if which == 0 else kw_ptr
                squares = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
                if BLOCK_PASS > 0:
                    tail_f = tail.to(tl.float32)
                    squares += tl.sum(tail_f * tail_f, axis=1)
                inv_rms = tl.rsqrt(squares / HEAD_DIM + qk_eps)[:, None]
                w1 = tl.load(w_ptr + d, mask=in_half, other=0.0).to(tl.float32)[None, :]
                w2 = tl.load(w_ptr + HALF + d, mask=in_half, other=0.0).to(tl.float32)[None, :]
                x1 = _scale_normed(x1 * inv_rms, w1, dt, QK_UNIT_OFFSET)
                x2 = _scale_normed(x2 * inv_rms, w2, dt, QK_UNIT_OFFSET)
                if BLOCK_PASS > 0:  # the tail does not rotate: its normed value is written back in place
                    wt = tl.load(w_ptr + p, mask=p < HEAD_DIM, other=0.0).to(tl.float32)[None, :]
                    tail = _scale_normed(tail_f * inv_rms, wt, dt, QK_UNIT_OFFSET).to(dt)
                    tl.store(base + tail_offs, tail, mask=pmask)
            y1 = (x1 * cos - x2 * sin).to(base.dtype.element_ty)
            y2 = (x2 * cos + x1 * sin).to(base.dtype.element_ty)
            tl.store(base + offs, y1, mask=mask)
            tl.store(base + offs + HALF, y2, mask=mask)
            if STORE_KV and which == 1:  # the rotated K row also goes to its pool slot
                row = slot * stride_kb + heads[:, None] * HEAD_DIM + d[None, :]
                tl.store(k_buf + row, y1, mask=mask)
                tl.store(k_buf + row + HALF, y2, mask=mask)
                if BLOCK_PASS > 0:  # partial rotary: K's unrotated tail goes to the pool too
                    tl.store(k_buf + slot * stride_kb + heads[:, None] * HEAD_DIM + p[None, :], tail, mask=pmask)
        if STORE_KV:
            offs_v = tl.arange(0, BLOCK_V)
            v_mask = offs_v < v_row
            v = tl.load(v_ptr + token * stride_v + offs_v, mask=v_mask, other=0.0)
            if NORM_V:  # RMSNorm of the row, rounded as _rmsnorm_kernel does, written back in place and stored
                vf = v.to(tl.float32)
                normed = (vf * tl.rsqrt(tl.sum(vf * vf, axis=0) / v_row + v_eps)).to(v_ptr.dtype.element_ty)
                w = tl.load(vw_ptr + offs_v, mask=v_mask, other=0.0)
                v = (w.to(tl.float32) * normed.to(tl.float32)).to(v_ptr.dtype.element_ty)
                tl.store(v_ptr + token * stride_v + offs_v, v, mask=v_mask)
            tl.store(v_buf + slot * stride_vb + offs_v, v, mask=v_mask)


def apply_rotary_inplace(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    head_dim: int,
    kv_store=None,
    rotary_dim: Optional[int] = None,
    interleaved: bool = False,
    qk_norm=None,
    query_absorb: Optional[HeadMatmul] = None,
) -> None:
    """Rotate-half rotary on q [T, Hq*D] and k [T, Hkv*D] (rows may be strided views of qkv), on the first
    ``rotary_dim`` features of each head (all by default; partial rotary leaves the rest as they are). q and k may
    also be [T, H, D] views with any head stride (DeepSeek's rope part of each head, inside q's rows).

    ``interleaved``: the pairs (x_2i, x_2i+1) rotate instead, the result de-interleaved
    (rotary_embedding.rotate_pairs; the whole head rotates).

    With ``kv_store`` (a FusedSetKVBufferArg) the same kernel also writes the rotated K rows and
    ``kv_store.value``'s V rows into the pool buffers at ``kv_store.cache_loc``: a decode layer then
    runs one kernel where rotary, a V copy and the KV store were three. With ``kv_store.value_norm`` each V row
    is RMS-normed first (in place too): MLA's latent, its kv_a_layernorm one kernel fewer.

    With ``qk_norm`` (a rotary_embedding.QKNorm) each head of q and k is RMS-normed first, in place (Qwen3's and
    GLM-4.5's per-head norms: two kernels fewer a layer); not with ``interleaved``.

    With ``query_absorb`` (a head_matmul.HeadMatmul: MLA's q_nope through W_UK) the same launch also computes that
    product, its tiles as programs after the tokens': the attention's first kernel one launch fewer a layer."""
    n_tokens = q.shape[0]
    if n_tokens == 0:
        return
    hq, stride_qh = _heads_and_stride(q, head_dim)
    hk, stride_kh = _heads_and_stride(k, head_dim)
    rot = rotary_dim or head_dim
    if interleaved and rot != head_dim:
        raise ValueError(f"interleaved rotary rotates whole heads, got rotary_dim {rot} of {head_dim}")
    if kv_store is None:
        v, k_buf, v_buf, loc, stride_v, stride_kb, stride_vb, v_row = q, q, q, positions, 0, 0, 0, 1
    else:
        v, k_buf, v_buf, loc = kv_store.value, kv_store.k_buffer, kv_store.v_buffer, kv_store.cache_loc
        stride_v, stride_kb, stride_vb, v_row = v.stride(0), k_buf.stride(0), v_buf.stride(0), v.shape[1]
    norm = kv_store.value_norm if kv_store is not None else None
    v_weight, v_eps = norm if norm is not None else (q, 0.0)
    if qk_norm is not None and interleaved:
        raise ValueError("the per-head q/k norm is fused with rotate-half rotary only, not interleaved pairs")
    q_weight, k_weight, qk_eps = (qk_norm.q_weight, qk_norm.k_weight, qk_norm.eps) if qk_norm else (q, q, 0.0)
    pdl = pdl_available(q)
    if query_absorb is None:  # placeholders: no program reads them
        ax = aw = ay = q
        absorb_tiles = dict(grid=(0, 1, 1), K=1, N=1, BLOCK_T=1, BLOCK_N=1, BLOCK_K=1, DOT_PRECISION="ieee")
        absorb_strides = (0,) * 7
    else:
        ax, aw, ay = query_absorb.x, query_absorb.w, query_absorb.out
        absorb_tiles, absorb_strides = query_absorb.launch(), query_absorb.strides()
    absorb_grid = absorb_tiles.pop("grid")
    _rotary_kernel[(n_tokens + absorb_grid[0] * absorb_grid[1] * absorb_grid[2],)](
        q,
        k,
        cos_cache,
        sin_cache,
        positions,
        q.stride(0),
        k.stride(0),
        stride_qh,
        stride_kh,
        cos_cache.stride(0),
        hq,
        hk,
        v,
        k_buf,
        v_buf,
        loc,
        stride_v,
        stride_kb,
        stride_vb,
        v_row,
        v_weight,
        v_eps,
        q_weight,
        k_weight,
        qk_eps,
        n_tokens,
        ax,
        aw,
        ay,
        *absorb_strides,
        HEAD_DIM=head_dim,
        HALF=rot // 2,
        BLOCK_HALF=triton.next_power_of_2(rot // 2),
        BLOCK_PASS=triton.next_power_of_2(head_dim - rot) if head_dim > rot else 0,
        BLOCK_H=triton.next_power_of_2(max(hq, hk)),
        STORE_KV=kv_store is not None,
        BLOCK_V=triton.next_power_of_2(v_row),
        NORM_V=norm is not None,
        INTERLEAVED=interleaved,
        QK_NORM=qk_norm is not None,
        QK_UNIT_OFFSET=qk_norm is not None and qk_norm.unit_offset,
        ABSORB=query_absorb is not None,
        A_K=absorb_tiles["K"],
        A_N=absorb_tiles["N"],
        A_BLOCK_T=absorb_tiles["BLOCK_T"],
        A_BLOCK_N=absorb_tiles["BLOCK_N"],
        A_BLOCK_K=absorb_tiles["BLOCK_K"],
        A_N_BLOCKS=absorb_grid[1],
        A_T_BLOCKS=absorb_grid[2],
        A_DOT_PRECISION=absorb_tiles["DOT_PRECISION"],
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )


def _heads_and_stride(x: torch.Tensor, head_dim: int) -> tuple[int, int]:
    """(heads, head stride) of [T, H * D] rows (heads side by side) or a [T, H, D] view (rows contiguous)."""
    if x.dim() == 3:
        if x.shape[2] != head_dim or x.stride(2) != 1:
            raise ValueError(f"rotary wants [T, H, {head_dim}] with contiguous heads, got {tuple(x.shape)}")
        return x.shape[1], x.stride(1)
    if x.stride(1) != 1:
        raise ValueError("rotary wants contiguous rows")
    return x.shape[1] // head_dim, head_dim


@triton.jit
def _gemma_rmsnorm_kernel(
    x_ptr,
    res_ptr,
    out_ptr,
    post_w_ptr,
    w_ptr,
    n_cols,
    sx,
    sres,
    so,
    post_eps,
    eps,
    SANDWICH: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    # Gemma's RMSNorm: the scale is (1 + w) and the whole product stays in fp32, rounded once (Llama's kernel above
    # rounds the normalised value before scaling). SANDWICH: x is a block's output; its post-norm joins the residual
    # stream (rounded as torch's add of the two), and the stream's next norm is the result.
    pdl_prologue(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = x_ptr.dtype.element_ty  # the norms' outputs are in x's dtype (as torch's norm returns them)
    xf = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if SANDWICH:
        post_w = tl.load(post_w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        post = _scale_normed(xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + post_eps), post_w, dt, True)
        h = (tl.load(res_ptr + row * sres + cols, mask=mask, other=0.0).to(tl.float32) + post).to(
            res_ptr.dtype.element_ty
        )
        tl.store(res_ptr + row * sres + cols, h, mask=mask)
        xf = h.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = _scale_normed(xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps), w, dt, True)
    tl.store(out_ptr + row * so + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def gemma_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    sandwich: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> torch.Tensor:
    """Gemma's RMSNorm of the rows of x [T, D] (``layernorm.gemma_rms_normed``), one kernel, into a new tensor.

    ``sandwich`` = (residual [T, D], post-norm weight, its eps): x is a block's output (attention's, the MLP's); the
    residual stream gets its post-norm added in place, and the result is this norm of the updated stream: Gemma 2/3's
    ``residual + post_norm(x)`` then the next norm, one kernel where torch runs twenty-one (ten a norm, one add)."""
    if x.dim() != 2:
        raise ValueError(f"gemma_rmsnorm normalizes the rows of a 2-D x, got shape {tuple(x.shape)}")
    n_tok, n_cols = x.shape
    out = torch.empty(n_tok, n_cols, dtype=x.dtype, device=x.device)
    res, post_weight, post_eps = sandwich if sandwich is not None else (x, weight, 0.0)  # dummies unless SANDWICH
    if sandwich is not None and (res.shape != x.shape or res.stride(1) != 1):
        raise ValueError(f"the residual stream must be [T, D] rows like x {tuple(x.shape)}, got {tuple(res.shape)}")
    if x.stride(1) != 1:
        raise ValueError("gemma_rmsnorm wants contiguous rows")
    pdl = pdl_available(x)
    if n_tok:
        _gemma_rmsnorm_kernel[(n_tok,)](
            x,
            res,
            out,
            post_weight,
            weight,
            n_cols,
            x.stride(0),
            res.stride(0),
            out.stride(0),
            post_eps,
            eps,
            SANDWICH=sandwich is not None,
            BLOCK=triton.next_power_of_2(n_cols),
            PDL=pdl,
            launch_pdl=pdl,
            num_warps=4 if n_cols <= 1024 else 8,
        )
    return out


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    q_ptr,
    qs_ptr,
    d,
    n_rows,
    stride_x,
    stride_out,
    stride_q,
    stride_qs_row,
    stride_qs_group,
    BLOCK: tl.constexpr,
    QUANTIZE: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (cols < d) & (row < n_rows)  # rows past n_rows: QUANTIZE's padding rows
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    if QUANTIZE:  # the row as the block-fp8 projection after it (down_proj) takes it, not written in x's dtype
        v = y.to(x_ptr.dtype.element_ty).to(tl.float32)  # the output the quantization kernel would read
        first_group = tl.program_id(1) * (BLOCK // 128)
        store_quantized_groups(v, first_group, d, q_ptr + row * stride_q, qs_ptr + row * stride_qs_row,
                               stride_qs_group, BLOCK, ROUND_BY_HAND)  # fmt: skip
    else:
        tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, quantize: ActivationLayout | None = None) -> torch.Tensor | BlockFp8Activation:
    """silu(gate) * up of x = [gate | up] ([T, 2d] -> [T, d]). `quantize`: the result handed to the block-fp8
    projection after it, quantized per token and 128-column group in that layout (the same bits as the result
    through ``fp8_block_kernels.quantize_groups``), instead of written in x's dtype."""
    n_rows, two_d = x.shape
    d = two_d // 2
    quantized = None if quantize is None else empty_block_fp8_activation(n_rows, d, x.dtype, quantize, x.device)
    out = torch.empty((n_rows, d), dtype=x.dtype, device=x.device) if quantized is None else x  # x: a dummy
    q, qs = (quantized.q, quantized.scale) if quantized is not None else (x, x)  # dummies unless quantizing
    programs = n_rows if quantized is None else q.shape[0]  # padding rows too
    if programs:
        # Quantizing: whole 128-column groups a program (d >= 128: a power of two from 128 up).
        block = min(max(triton.next_power_of_2(d), 128 if quantized is not None else 1), 2048)
        pdl = pdl_available(x)
        _silu_and_mul_kernel[(programs, triton.cdiv(d, block))](
            x,
            out,
            q,
            qs,
            d,
            n_rows,
            x.stride(0),
            out.stride(0),
            q.stride(0),
            *(qs.stride() if quantized is not None else (0, 0)),
            BLOCK=block,
            QUANTIZE=quantized is not None,
            ROUND_BY_HAND=in_interpreter(x),
            PDL=pdl,
            launch_pdl=pdl,
            num_warps=4,
        )
    return out if quantized is None else quantized


# torch's tanh-approximated gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), its kernel's constants
# (constexprs: the GPU compiler takes no plain Python global inside a kernel)
GELU_TANH_BETA = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
GELU_TANH_KAPPA = tl.constexpr(0.044715)


@triton.jit
def _gelu_tanh_and_mul_kernel(x_ptr, out_ptr, d, stride_x, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    # In fp32 in torch's order, the gelu rounded to the activation dtype, then the product: F.gelu(gate) * up.
    inner = GELU_TANH_BETA * (gate + GELU_TANH_KAPPA * (gate * gate * gate))
    gelu = (0.5 * gate * (1.0 + tanh(inner))).to(dt).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (gelu * up).to(dt), mask=mask)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up of x = [gate | up] ([T, 2d] -> [T, d]) in one kernel (Gemma's GeGLU; torch ran two), rounded
    where torch's two ops round, with torch's tanh on the GPU (libdevice's; the interpreter's may differ in the last bit)."""
    n_rows, two_d = x.shape
    d = two_d // 2
    out = torch.empty((n_rows, d), dtype=x.dtype, device=x.device)
    if n_rows:
        block = min(triton.next_power_of_2(d), 2048)
        pdl = pdl_available(x)
        _gelu_tanh_and_mul_kernel[(n_rows, triton.cdiv(d, block))](
            x, out, d, x.stride(0), out.stride(0), BLOCK=block, PDL=pdl, launch_pdl=pdl, num_warps=4
        )
    return out
