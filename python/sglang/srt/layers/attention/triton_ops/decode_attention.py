"""Split-KV ("flash-decoding") attention for decode over a token-major paged KV pool.

Layout (one layer):
  * ``k_buffer [num_slots, Hkv, D]`` / ``v_buffer [num_slots, Hkv, Dv]``: the pool. A request's
    tokens live at arbitrary slots; the allocator does the paging, kernels only see slot ids.
  * ``kv_indptr [bs+1]`` (int32) and ``kv_indices`` (int32/int64): request ``i`` owns slots
    ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` -- its whole context, current token included.
  * ``q [bs, Hq, D]``, ``o [bs, Hq, Dv]`` with ``Hq % Hkv == 0`` (grouped-query attention).

Why two stages: with one token per request, a batch of 1 at 8k context would give only ``Hkv``
programs, far too few to saturate HBM. Stage 1 therefore splits each request's KV range into
``num_kv_splits[i]`` chunks and computes, per chunk, the softmax-normalised partial output and its
log-sum-exp into fp32 scratch (``attn_logits``, ``attn_lse``); stage 2 merges the chunks. A request whose
context is one chunk (short contexts in big batches) has its output written by stage 1 directly; when every
request is one chunk (``max_kv_splits == 1``) stage 2 is not launched.

Why grouped: one stage-1 program serves *all* q heads of one kv head (``BLOCK_H`` rows, masked,
padded to >= 16 so ``tl.dot`` can use tensor cores), so each K/V block is read from HBM once per
kv head instead of once per q head. That keeps decode bandwidth-bound.

CUDA graphs: everything data-dependent (lengths, split counts, slot ids) is read on the device;
the grid depends only on shapes and the host int ``max_kv_splits``. Nothing syncs with the host.
Rows with an empty context (graph padding) produce zeros.

For a block-fp8 o_proj (a native FP8 checkpoint) with 128-wide value heads, the kernel that writes a head's
output (stage 2, or stage 1 for a request of one chunk) can write it quantized instead: each head's row is one
128-column group of o_proj's input, so it gets its codes and one scale (``quantized``; the same bits as the
output through the quantization kernel), and o_proj's quantization launch goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue
from sglang.srt.layers.quantization.block_fp8_activation import ROW_MAJOR, ActivationLayout, BlockFp8Activation
from sglang.srt.layers.quantization.fp8 import FP8_BLOCK
from sglang.srt.layers.quantization.fp8_tile import quantize_tile_rows
from sglang.srt.layers.triton_math import tanh
from sglang.srt.mem_cache.memory_pool import FP8_KV_DTYPES


@triton.jit
def _store_heads(
    Out, QOut, QScale, b, heads, offs_dv, mask_h, mask_dv, out, stride_ob, stride_oh, stride_qb, stride_sb,
    DV: tl.constexpr, QUANTIZE: tl.constexpr, ROUND_BY_HAND: tl.constexpr,
):  # fmt: skip
    """The output rows ``out`` [heads, BLOCK_DV] (fp32) of request b: into Out in its dtype, or (QUANTIZE; DV is one
    128-column group) rounded to Out's dtype and quantized, one scale per head: codes at QOut[b, head * DV + d],
    scales at QScale[b, head] (o_proj's input [bs, heads * DV], row-major scales)."""
    mask = mask_h[:, None] & mask_dv[None, :]
    if QUANTIZE:
        q, scale = quantize_tile_rows(out.to(Out.dtype.element_ty).to(tl.float32), QOut.dtype.element_ty, ROUND_BY_HAND)
        tl.store(QOut + b * stride_qb + heads[:, None] * DV + offs_dv[None, :], q, mask=mask)
        tl.store(QScale + b * stride_sb + heads, scale, mask=mask_h)
    else:
        tl.store(
            Out + b * stride_ob + heads[:, None] * stride_oh + offs_dv[None, :], out.to(Out.dtype.element_ty), mask=mask
        )


@triton.jit
def _split_range(kv_len, num_splits, split_id, ALIGN: tl.constexpr):
    """[start, end) of chunk ``split_id``; chunk length rounded up to ALIGN (may be empty)."""
    split_len = tl.cdiv(tl.cdiv(kv_len, num_splits), ALIGN) * ALIGN
    start = split_len * split_id
    end = tl.minimum(start + split_len, kv_len)
    return start, end


@triton.jit
def _attend_kv_block(
    acc,
    m_i,
    l_i,
    q,
    K,
    V,
    rows,
    mask_n,
    mask_qk,
    kv_head,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    offs_d,
    offs_dv,
    mask_d,
    mask_dv,
    sm_scale,
    logit_cap,
    USE_CAP: tl.constexpr,
    v_scale,
    V_SCALED: tl.constexpr,
):
    """One online-softmax step over BLOCK_N keys at int64 ``rows`` of K/V (pool or extend rows).

    ``q [M, BLOCK_D]``; ``mask_qk`` broadcasts to ``[M, BLOCK_N]``. Scores go to the log2 domain
    so the exponentials are ``exp2``. Returns the updated (acc, m_i, l_i). A KV cache with the checkpoint's
    scales stores k / k_scale and v / v_scale: the caller folds k_scale into ``sm_scale``; ``V_SCALED``
    multiplies this block's probabilities x V by ``v_scale`` (the extend kernel's prefix: only those rows
    come from the cache).
    """
    k = tl.load(  # [BLOCK_D, BLOCK_N]: K^T for the dot
        K + rows[None, :] * stride_kn + kv_head * stride_kh + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None],
        other=0.0,
    )
    qk = tl.dot(q, k.to(q.dtype)) * sm_scale
    if USE_CAP:
        qk = logit_cap * tanh(qk / logit_cap)
    qk = tl.where(mask_qk, qk * 1.4426950408889634, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        V + rows[:, None] * stride_vn + kv_head * stride_vh + offs_dv[None, :],
        mask=mask_n[:, None] & mask_dv[None, :],
        other=0.0,
    )
    pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    if V_SCALED:
        pv = pv * v_scale
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _decode_grouped_stage1(
    Q,
    K_Buf,
    V_Buf,
    Kv_Indptr,
    Kv_Indices,
    Att_Out,
    Att_Lse,
    O,  # noqa: E741 - the attention output, written here for a request of one chunk (SINGLE_SPLIT_DIRECT)
    QOut,  # QUANTIZE: O's rows quantized (fp8 codes [bs, Hq * DV], scales [bs, Hq])
    QScale,
    Num_Kv_Splits,
    sm_scale,
    logit_cap,
    sliding_window,
    v_scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_ab,
    stride_ah,
    stride_as,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    stride_qob,
    stride_qsb,
    kv_group_num: tl.constexpr,
    progs_per_kv_head: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    USE_CAP: tl.constexpr,
    WHILE_LOOPS: tl.constexpr,
    PDL: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    KV_HEADS_ADJACENT: tl.constexpr,
    SINGLE_SPLIT_DIRECT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    V_SCALED: tl.constexpr,
    QUANTIZE: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    pdl_prologue(PDL)
    if KV_HEADS_ADJACENT:
        pid_h = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        pid_h = tl.program_id(1)
    split_id = tl.program_id(2)

    kv_head = pid_h // progs_per_kv_head
    group_off = (pid_h % progs_per_kv_head) * BLOCK_H
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < kv_group_num - group_off
    heads = kv_head * kv_group_num + group_off + offs_h

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d = offs_d < D
    mask_dv = offs_dv < DV

    kv_start = tl.load(Kv_Indptr + b)
    kv_len = tl.load(Kv_Indptr + b + 1) - kv_start
    if USE_WINDOW:  # the query (the last token) sees only the last `sliding_window` keys: skip the rest
        skipped = tl.maximum(kv_len - sliding_window, 0)
        kv_start += skipped
        kv_len -= skipped
    # Clamp to [1, grid size] so a bad split count can neither divide by 0 nor drop chunks.
    num_splits = tl.minimum(tl.maximum(tl.load(Num_Kv_Splits + b), 1), tl.num_programs(2))
    start, end = _split_range(kv_len, num_splits, split_id, SPLIT_ALIGN)
    # One chunk: its normalised output is the answer, so it goes to O and stage 2 leaves the request alone.
    single = SINGLE_SPLIT_DIRECT & (num_splits == 1)

    if (split_id < num_splits) & (end > start):
        q = tl.load(
            Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_h[:, None] & mask_d[None, :],
            other=0.0,
        )
        if DOT_DTYPE == tl.float16:  # bf16 queries beyond fp16's range saturate instead of becoming inf
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0)
        q = q.to(DOT_DTYPE)  # K/V tiles are upcast to q's dtype: see dot_dtype
        m_i = tl.full([BLOCK_H], -1e30, dtype=tl.float32)  # finite: no (-inf) - (-inf)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
        if WHILE_LOOPS:  # interpreter: see kernel_dispatch
            n0 = start
            while n0 < end:
                mask_n = n0 + offs_n < end
                slot = tl.load(Kv_Indices + kv_start + n0 + offs_n, mask=mask_n, other=0)
                acc, m_i, l_i = _attend_kv_block(
                    acc,
                    m_i,
                    l_i,
                    q,
                    K_Buf,
                    V_Buf,
                    slot.to(tl.int64),
                    mask_n,
                    mask_n[None, :],
                    kv_head,
                    stride_kb,
                    stride_kh,
                    stride_vb,
                    stride_vh,
                    offs_d,
                    offs_dv,
                    mask_d,
                    mask_dv,
                    sm_scale,
                    logit_cap,
                    USE_CAP,
                    1.0,
                    False,  # v_scale is applied to the whole output below
                )
                n0 += BLOCK_N
        else:  # a `for` loop, so num_stages can software-pipeline the gathers
            for n0 in range(start, end, BLOCK_N):
                mask_n = n0 + offs_n < end
                slot = tl.load(Kv_Indices + kv_start + n0 + offs_n, mask=mask_n, other=0)
                acc, m_i, l_i = _attend_kv_block(
                    acc,
                    m_i,
                    l_i,
                    q,
                    K_Buf,
                    V_Buf,
                    slot.to(tl.int64),
                    mask_n,
                    mask_n[None, :],
                    kv_head,
                    stride_kb,
                    stride_kh,
                    stride_vb,
                    stride_vh,
                    offs_d,
                    offs_dv,
                    mask_d,
                    mask_dv,
                    sm_scale,
                    logit_cap,
                    USE_CAP,
                    1.0,
                    False,  # v_scale is applied to the whole output below
                )
        out = acc / l_i[:, None]
        if V_SCALED:  # every value came from the cache, stored as v / v_scale
            out = out * v_scale
        if single:
            _store_heads(
                O, QOut, QScale, b, heads, offs_dv, mask_h, mask_dv, out, stride_ob, stride_oh, stride_qob, stride_qsb,
                DV, QUANTIZE, ROUND_BY_HAND,
            )  # fmt: skip
        else:
            lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # natural-log LSE of this chunk
            tl.store(
                Att_Out + b * stride_ab + heads[:, None] * stride_ah + split_id * stride_as + offs_dv[None, :],
                out,
                mask=mask_h[:, None] & mask_dv[None, :],
            )
            tl.store(Att_Lse + b * stride_lb + heads * stride_lh + split_id, lse, mask=mask_h)
    elif single & (split_id == 0):  # an empty context (graph padding): zeros, as stage 2 would write
        zeros = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
        _store_heads(
            O, QOut, QScale, b, heads, offs_dv, mask_h, mask_dv, zeros, stride_ob, stride_oh, stride_qob, stride_qsb,
            DV, QUANTIZE, ROUND_BY_HAND,
        )  # fmt: skip


@triton.jit
def _decode_stage2(
    Att_Out,
    Att_Lse,
    O,  # noqa: E741 - the attention output, named as in the papers
    QOut,  # QUANTIZE: as stage 1's
    QScale,
    Kv_Indptr,
    Num_Kv_Splits,
    sliding_window,
    stride_ab,
    stride_ah,
    stride_as,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    stride_qob,
    stride_qsb,
    MAX_KV_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    PDL: tl.constexpr,
    SINGLE_SPLIT_DIRECT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    QUANTIZE: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    """Merge request b / head h's chunks: their LSE-weighted sum. All chunks load as one
    [BLOCK_S, BLOCK_DV] tile (independent loads, one memory round trip, not one per chunk).
    SINGLE_SPLIT_DIRECT: a request of one chunk was written by stage 1; nothing to do for it."""
    pdl_prologue(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    num_splits = tl.minimum(tl.maximum(tl.load(Num_Kv_Splits + b), 1), MAX_KV_SPLITS)
    if (not SINGLE_SPLIT_DIRECT) | (num_splits > 1):
        offs_s = tl.arange(0, BLOCK_S)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_dv = offs_dv < DV
        kv_len = tl.load(Kv_Indptr + b + 1) - tl.load(Kv_Indptr + b)
        if USE_WINDOW:  # stage 1 split only the window's keys
            kv_len = tl.minimum(kv_len, sliding_window)
        split_len = tl.cdiv(tl.cdiv(kv_len, num_splits), SPLIT_ALIGN) * SPLIT_ALIGN
        written = (offs_s < num_splits) & (offs_s * split_len < kv_len)  # the chunks stage 1 wrote
        lse = tl.load(Att_Lse + b * stride_lb + h * stride_lh + offs_s, mask=written, other=float("-inf"))
        part = tl.load(
            Att_Out + b * stride_ab + h * stride_ah + offs_s[:, None] * stride_as + offs_dv[None, :],
            mask=written[:, None] & mask_dv[None, :],
            other=0.0,
        )
        w = tl.exp(lse - tl.maximum(tl.max(lse, 0), -1e30))  # unwritten chunks: exp(-inf) = 0
        out = tl.sum(w[:, None] * part, 0) / tl.maximum(tl.sum(w, 0), 1e-30)  # empty row -> zeros
        head = h + tl.arange(0, 1)  # one head: a [1, BLOCK_DV] tile for the shared store
        _store_heads(
            O, QOut, QScale, b, head, offs_dv, head >= 0, mask_dv, out[None, :], stride_ob, stride_oh, stride_qob,
            stride_qsb, DV, QUANTIZE, ROUND_BY_HAND,
        )  # fmt: skip


@dataclass(frozen=True)
class DecodeKernelConfig:
    """Launch choices of stage 1. ``benchmark/decode_roofline/tune_decode_attention.py`` measures
    them on the GPU; the default is its best for 128-wide heads on an H200 across batch 1-64."""

    block_n: int = 128  # keys per loop step, also the chunk alignment
    num_warps: int = 4
    num_stages: int = 3
    # Grid order. True: the programs of one request's chunk for its kv heads get adjacent ids, so they run
    # together and read each token's K (and V) row, all heads side by side in the token-major pool, at
    # once (DRAM page locality): 32 layers at batch 256 x 1k 8.54 -> 8.24 ms on the H200, batch 1-64 within
    # 1% (benchmark/decode_roofline/tuning_grid_order/). False: adjacent ids are requests of one kv head.
    kv_heads_adjacent: bool = True
    # A request of one chunk gets its output from stage 1 (no partials, nothing for stage 2 to merge); with
    # one chunk for every request (max_kv_splits 1: batches whose requests alone fill the GPU) stage 2 is not
    # launched at all.
    single_split_direct: bool = True
    # Over an fp8 KV cache the dots run in fp16 (see dot_dtype); False: in the query's dtype (the choice
    # before, kept for benchmark/decode_roofline/bench_kv_cache_dtype.py's comparison).
    fp8_dots_in_fp16: bool = True

    @classmethod
    def for_head_dim(cls, head_dim: int) -> "DecodeKernelConfig":
        """The tuned default up to 128-wide heads; wider heads keep the earlier, untuned choice (more
        warps hold the wider accumulator, smaller K/V tiles fit shared memory)."""
        return cls() if head_dim <= 128 else cls(block_n=64, num_warps=8, num_stages=2)


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def dot_dtype(q_dtype: torch.dtype, kv_dtype: torch.dtype, fp8_dots_in_fp16: bool = True) -> torch.dtype:
    """The dtype of stage 1's two dots (scores, then probabilities x V): the query's, except over an fp8 KV
    cache (``--kv-cache-dtype fp8_*``), whose tiles go to fp16: one conversion instruction per pair of values
    on sm89+ (``cvt.rn.f16x2.e4m3x2``), where triton reaches bf16 through fp16 plus one more per value, three
    times the instructions, which cost more than the halved reads save
    (``benchmark/decode_roofline/bench_kv_cache_dtype.py``). Every fp8 value is exact in fp16; a bf16 query
    entry beyond fp16's range is clamped to +-65504 (stage 1), not turned into inf."""
    return torch.float16 if kv_dtype in FP8_KV_DTYPES and fp8_dots_in_fp16 else q_dtype


BLOCK_H = 16  # q-head rows per stage-1 program: tl.dot needs M >= 16; masked rows cost no HBM traffic


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    config: Optional[DecodeKernelConfig] = None,
    sliding_window: int = -1,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    quantized: Optional[BlockFp8Activation] = None,
) -> None:
    """Decode attention, one query token per request; writes ``o`` in place.

    ``quantized`` (128-wide value heads; ``writes_quantized``): the output is written there instead of ``o``,
    quantized per head (one 128-column group of o_proj's input [bs, Hq * Dv]) with row-major scales.

    ``k_scale`` / ``v_scale``: the checkpoint's KV cache scales (the buffers hold k / k_scale, v / v_scale);
    scores are scaled by sm_scale x k_scale and outputs by v_scale. None: the buffers hold K/V as they are.

    ``sliding_window`` > 0: each query attends only to its request's last ``sliding_window`` keys (its
    own included), transformers' Mistral window; -1: the whole context.

    ``attn_logits [bs, Hq, max_kv_splits, Dv]`` and ``attn_lse [bs, Hq, max_kv_splits]`` (fp32)
    are scratch; ``num_kv_splits [bs]`` (int32, 1..max_kv_splits) is read on the device, so a
    captured CUDA graph may change it (and indptr/indices) between replays.
    """
    bs, hq, d = q.shape
    hkv = k_buffer.shape[1]
    dv = v_buffer.shape[-1]
    config = config or DecodeKernelConfig.for_head_dim(max(d, dv))
    assert hq % hkv == 0, f"num_q_heads {hq} not a multiple of num_kv_heads {hkv}"
    assert o.shape == (bs, hq, dv) and k_buffer.shape[-1] == d
    assert attn_logits.shape[2] >= max_kv_splits and attn_lse.shape[2] >= max_kv_splits
    for t in (q, k_buffer, v_buffer, o, attn_logits, attn_lse):
        assert t.stride(-1) == 1, "last dim must be contiguous"
    if quantized is not None and not (
        writes_quantized(dv, quantized.layout) and quantized.q.shape == (bs, hq * dv) and quantized.rows == bs
    ):
        raise ValueError(
            "decode attention writes its output quantized only for 128-wide value heads into row-major buffers of "
            f"[{bs}, {hq * dv}]: got value heads of {dv}, {quantized.layout}, codes {tuple(quantized.q.shape)}"
        )
    qout, qscale = (quantized.q, quantized.scale) if quantized is not None else (o, o)  # dummies unless quantizing
    quantize = {
        "QUANTIZE": quantized is not None,
        "ROUND_BY_HAND": in_interpreter(q),
    }
    if bs == 0:
        return
    group = hq // hkv
    interp = not q.is_cuda
    progs_per_kv_head = triton.cdiv(group, BLOCK_H)
    block_d = max(16, triton.next_power_of_2(d))
    block_dv = max(16, triton.next_power_of_2(dv))
    pdl = pdl_available(q)
    extra = {} if interp else {"num_warps": config.num_warps, "num_stages": config.num_stages, "launch_pdl": pdl}

    head_progs = hkv * progs_per_kv_head
    grid1 = (head_progs, bs, max_kv_splits) if config.kv_heads_adjacent else (bs, head_progs, max_kv_splits)
    _decode_grouped_stage1[grid1](
        q,
        k_buffer,
        v_buffer,
        kv_indptr,
        kv_indices,
        attn_logits,
        attn_lse,
        o,
        qout,
        qscale,
        num_kv_splits,
        float(sm_scale) * (1.0 if k_scale is None else float(k_scale)),
        float(logit_cap),
        int(sliding_window),
        1.0 if v_scale is None else float(v_scale),
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        attn_logits.stride(0),
        attn_logits.stride(1),
        attn_logits.stride(2),
        attn_lse.stride(0),
        attn_lse.stride(1),
        o.stride(0),
        o.stride(1),
        qout.stride(0),
        qscale.stride(0),
        kv_group_num=group,
        progs_per_kv_head=progs_per_kv_head,
        D=d,
        DV=dv,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        BLOCK_N=config.block_n,
        BLOCK_H=BLOCK_H,
        SPLIT_ALIGN=config.block_n,
        USE_CAP=logit_cap > 0,
        WHILE_LOOPS=in_interpreter(q),
        PDL=pdl,
        DOT_DTYPE=_TL_DTYPES[dot_dtype(q.dtype, k_buffer.dtype, config.fp8_dots_in_fp16)],
        KV_HEADS_ADJACENT=config.kv_heads_adjacent,
        SINGLE_SPLIT_DIRECT=config.single_split_direct,
        USE_WINDOW=sliding_window > 0,
        V_SCALED=v_scale is not None,
        **quantize,
        **extra,
    )
    if config.single_split_direct and max_kv_splits == 1:
        return  # every request is one chunk, written by stage 1
    extra2 = {} if interp else {"num_warps": 4, "num_stages": 1, "launch_pdl": pdl}
    _decode_stage2[(bs, hq)](
        attn_logits,
        attn_lse,
        o,
        qout,
        qscale,
        kv_indptr,
        num_kv_splits,
        int(sliding_window),
        attn_logits.stride(0),
        attn_logits.stride(1),
        attn_logits.stride(2),
        attn_lse.stride(0),
        attn_lse.stride(1),
        o.stride(0),
        o.stride(1),
        qout.stride(0),
        qscale.stride(0),
        MAX_KV_SPLITS=max_kv_splits,
        BLOCK_S=triton.next_power_of_2(max_kv_splits),
        DV=dv,
        BLOCK_DV=block_dv,
        SPLIT_ALIGN=config.block_n,
        PDL=pdl,
        SINGLE_SPLIT_DIRECT=config.single_split_direct,
        USE_WINDOW=sliding_window > 0,
        **quantize,
        **extra2,
    )


def writes_quantized(dv: int, layout: ActivationLayout) -> bool:
    """Whether decode_attention_fwd can write its output quantized for a block-fp8 o_proj taking ``layout``: each
    value head exactly one 128-column group, scales row-major with no padding rows (the skinny kernel's and the
    triton GEMM's layout; cuBLAS's, at larger batches, goes through the quantization kernel)."""
    return dv == FP8_BLOCK and layout == ROW_MAJOR


MIN_BLOCK_TOKENS = 1024  # keys per chunk of a long context: few long chunks stream best (tuning)


def decode_split_bounds(
    bs: int, num_kv_heads: int, num_sms: int, max_kv_splits: int, programs_per_sm: int = 2
) -> tuple[int, int]:
    """(min_splits, split cap) for a decode batch of ``bs`` requests.

    min_splits: chunks per request that give small batches ``programs_per_sm`` stage-1 programs per SM
    (1 once bs x kv_heads fills the GPU). The cap is stage 1's grid: twice that many programs in all, at
    most ``max_kv_splits``; more chunks would only add merge work and programs that exit at once
    (measured: 8 vs 16 chunks at batch 64 is 0.07 ms a step).
    """
    programs = max(bs * num_kv_heads, 1)
    wanted = programs_per_sm * num_sms
    return -(-wanted // programs), max(1, min(max_kv_splits, -(-2 * wanted // programs)))


def get_num_kv_splits(
    num_kv_splits_out: torch.Tensor,
    seq_lens: torch.Tensor,
    max_kv_splits: int,
    min_block_tokens: int = MIN_BLOCK_TOKENS,
    min_splits: int = 1,
    block_n: int = DecodeKernelConfig.block_n,
) -> None:
    """Fill ``num_kv_splits_out`` in place: ``ceil(seq_len / min_block_tokens)`` chunks, raised to
    ``min_splits`` (never below one ``block_n`` of keys per chunk), clamped to [1, max_kv_splits].

    Device-side torch ops only (no ``.item()``), so it can run inside a captured CUDA graph.
    Long contexts get many splits (batch 1 at 8k fills the SMs), short ones few (less merging).
    ``min_splits`` is for small batches, whose bs x kv_heads programs alone leave most SMs idle:
    batch 1 at 1k context with 8 kv heads would otherwise run 32 programs on 132 SMs.
    """
    splits = torch.div(seq_lens + (min_block_tokens - 1), min_block_tokens, rounding_mode="floor")
    if min_splits > 1:
        most = torch.div(seq_lens + (block_n - 1), block_n, rounding_mode="floor")
        splits = torch.maximum(splits, most.clamp(max=min_splits))
    splits = splits.clamp_(min=1, max=max(1, int(max_kv_splits)))
    num_kv_splits_out.copy_(splits)
