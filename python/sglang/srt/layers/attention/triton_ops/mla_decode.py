"""MLA decode (absorbed) over the latent pool, split-KV: attention of every head's latent-space query over each
request's latent rows [c_kv | k_rope].

Inputs (one layer):
  * ``q_latent [bs, H, KV_LORA]``: q_nope already through W_UK (mla_torch.absorbed_decode's first einsum);
    ``q_rope [bs, H, ROPE]`` rotated; any strides with contiguous rows (a [H, bs, .] buffer transposed is fine);
  * ``cache [num_slots, 1, KV_LORA + ROPE]``: MLATokenToKVPool's buffer (any float dtype; fp8 read as bytes
    viewed back, converted on load);
  * ``kv_indptr [bs+1]`` / ``kv_indices``: request ``i`` owns slots ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``
    (the triton backend's decode metadata, also in CUDA graphs).
Output: the latent context ``[bs, H, KV_LORA]`` in q_latent's dtype (or ``out``'s); W_UV maps it to each head's
values after. A request with no rows (graph padding) gets zeros.

Stage 1: one program serves BLOCK_H heads of one request over one chunk of its rows, so each latent row is read
once per BLOCK_H heads (once for all heads when H <= BLOCK_H, e.g. DeepSeek-V2-Lite's 16), instead of once per
head as a decompressed cache would need. The head blocks of one (request, chunk) get adjacent program ids, so a
model with several head blocks (DeepSeek-V3's 128 heads: 8) reads each row from HBM about once and from L2 after.

Chunks: their count (``num_kv_splits``, a host int: graphs capture a fixed grid) comes from the row count alone
(MLADecodeConfig.num_splits): the count whose programs fill whole waves of the SMs best. Each chunk's length is
rounded up to BLOCK_N, so a short context leaves the later chunks empty (they exit at once, weigh 0 in the merge).
Stage 2 merges the chunks' softmax-normalised contexts by their log-sum-exps into the output dtype; with one chunk
stage 1 writes the output itself and stage 2 is not launched. Nothing syncs with the host.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue


@dataclass(frozen=True)
class MLADecodeConfig:
    """Launch choices of the latent kernel. benchmark/mla/bench_mla_decode.py sweeps them on the GPU (with this
    default marked): which BLOCK_N / warps / stages and chunk rule win on V2-Lite's and V3's shapes."""

    # Chosen by benchmark/mla/bench_mla_decode.py on the H200 (2026-12-04): n64 w4 s2 was the fastest or within
    # 1.3x of the fastest in every cell (geomean 1.02x the cell's best; the earlier n32 w8 s2 1.55x).
    block_n: int = 64  # latent rows per loop step (and the chunk alignment): 16 left the loads latency-bound
    num_warps: int = 4  # 4 warps beat 8 on every V3 cell: the [BLOCK_H, KV_LORA] accumulator fits their registers
    # The rows are gathered through kv_indices (a load feeding a load), so triton's pipeliner splits the stages
    # between the two: 2-4 stages hold one row buffer (74 KB; the next step's copy waits for this step's dots),
    # 5 hold two (170 KB). Two measured slower (H100, 2026-12-07, benchmark/mla/README.md: geomean 1.45x the
    # cell's best against 1.00; V2-Lite batch 64 46.6 vs 47.0 us, 256 148 vs 112): one program an SM, not two.
    num_stages: int = 2
    block_h: int = 16  # heads per program; tl.dot needs >= 16 rows
    # Programs an SM is counted to run at once in the chunk rule's waves (num_splits). Two fit at 2 stages, but
    # counting two cuts more chunks, whose partials and merge cost more than the co-resident programs win
    # (H100, 2026-12-07: V2-Lite batch 64 50.8 vs 47.0 us, batch 16 19.7 vs 18.0).
    programs_per_sm: int = 1
    # At most this many chunks per row, so each chunk still has rows: 1k context / 32 chunks = 32 rows a chunk.
    max_splits: int = 32
    merge_block_d: int = 128  # latent columns per stage-2 program

    def num_splits(self, rows: int, heads: int, num_sms: int) -> int:
        """Chunks per query row for `rows` rows of `heads` heads on a GPU of `num_sms` SMs (a function of the
        shapes only, so a captured decode graph keeps its grid).

        With programs_per_sm programs an SM at a time, stage 1 lasts about (waves of programs) x (one program's
        time), and a program's time goes as its chunk's share of the rows, 1 / chunks, plus a fixed part (the
        query's loads, its partial, the merge), counted as one smallest chunk's share, 1 / max_splits. The count
        with the least of that wins, the fewest chunks among equals. Batch 64 of V2-Lite's 16 heads on 132 SMs:
        2 chunks (128 programs, one wave); filling the SMs instead (3 chunks, 192 programs) takes two waves of
        third-length chunks."""
        programs = max(rows, 1) * triton.cdiv(heads, self.block_h)

        def cost(splits: int) -> Fraction:
            waves = triton.cdiv(programs * splits, num_sms * self.programs_per_sm)
            return waves * (Fraction(1, splits) + Fraction(1, self.max_splits))

        return min(range(1, self.max_splits + 1), key=lambda s: (cost(s), s))


DEFAULT_CONFIG = MLADecodeConfig()
# The interpreter (CPU tests) has no SMs to fill: this many keeps its grids small.
INTERPRETER_SMS = 4


@functools.lru_cache(maxsize=None)
def _cuda_sms(device_index: int) -> int:
    """A fact of the device: asked once per device, not before every launch."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """The SM count the split choice targets on `device` (INTERPRETER_SMS off CUDA)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def _attend_rows(
    acc,
    m_i,
    l_i,
    ql,
    qr,
    cache,
    kv_indices,
    first,
    offs_n,
    n_left,
    stride_c,
    scaling_log2,
    offs_c,
    offs_r,
    rope_ok,
    KV_LORA: tl.constexpr,
):
    """One BLOCK_N step of the online softmax over rows kv_indices[first + offs_n] (the first n_left of them
    real), scores in base 2."""
    n_ok = offs_n < n_left
    dtype = ql.dtype  # the activation dtype: the cache's rows (fp8 too) go to it for the dots
    slots = tl.load(kv_indices + first + offs_n, mask=n_ok, other=0).to(tl.int64)
    rows = cache + slots[:, None] * stride_c
    latent = tl.load(rows + offs_c[None, :], mask=n_ok[:, None], other=0.0).to(dtype)  # [N, KV_LORA]
    k_rope = tl.load(rows + KV_LORA + offs_r[None, :], mask=n_ok[:, None] & rope_ok[None, :], other=0.0).to(dtype)
    scores = tl.dot(ql, tl.trans(latent)) + tl.dot(qr, tl.trans(k_rope))
    scores = tl.where(n_ok[None, :], scores * scaling_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(dtype), latent)
    return acc, m_new, l_i


@triton.jit
def _mla_decode_stage1(
    q_latent,
    q_rope,
    cache,
    kv_indptr,
    kv_indices,
    partial,
    lse,
    out,
    scaling_log2,
    stride_ql_b,
    stride_ql_h,
    stride_qr_b,
    stride_qr_h,
    stride_c,
    stride_p_b,
    stride_p_h,
    stride_p_s,
    stride_l_b,
    stride_l_h,
    stride_o_b,
    stride_o_h,
    num_heads,
    KV_LORA: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr,  # one chunk: write the normalised context to `out` (no partials, no stage 2)
    WHILE_LOOPS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    head_block = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    offs_c = tl.arange(0, KV_LORA)
    offs_r = tl.arange(0, BLOCK_ROPE)
    rope_ok = offs_r < ROPE
    offs_n = tl.arange(0, BLOCK_N)

    start_req = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - start_req
    # Chunks of whole BLOCK_N steps: a short context fills the first chunks, the rest stay empty.
    split_len = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, kv_len)

    # The dots run in the activation dtype (tensor cores for bf16) with fp32 accumulation; softmax in fp32, in
    # base 2 (log2(e) folded into the scale: exp2 is the hardware's instruction).
    m_i = tl.full([BLOCK_H], -1e30, dtype=tl.float32)  # finite: no (-inf) - (-inf)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, KV_LORA], dtype=tl.float32)
    if end > start:  # an empty chunk reads nothing
        ql = tl.load(
            q_latent + b * stride_ql_b + heads[:, None] * stride_ql_h + offs_c[None, :],
            mask=head_ok[:, None],
            other=0.0,
        )
        qr = tl.load(
            q_rope + b * stride_qr_b + heads[:, None] * stride_qr_h + offs_r[None, :],
            mask=head_ok[:, None] & rope_ok[None, :],
            other=0.0,
        )
        if WHILE_LOOPS:  # the interpreter: see kernel_dispatch
            n0 = start
            while n0 < end:
                acc, m_i, l_i = _attend_rows(
                    acc, m_i, l_i, ql, qr, cache, kv_indices, start_req + n0, offs_n, end - n0,
                    stride_c, scaling_log2, offs_c, offs_r, rope_ok, KV_LORA,
                )  # fmt: skip
                n0 += BLOCK_N
        else:  # a `for` loop, so num_stages can software-pipeline the gathers
            for n0 in range(start, end, BLOCK_N):
                acc, m_i, l_i = _attend_rows(
                    acc, m_i, l_i, ql, qr, cache, kv_indices, start_req + n0, offs_n, end - n0,
                    stride_c, scaling_log2, offs_c, offs_r, rope_ok, KV_LORA,
                )  # fmt: skip

    ctx = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # no rows: acc is 0, so zeros
    if DIRECT:
        tl.store(
            out + b * stride_o_b + heads[:, None] * stride_o_h + offs_c[None, :],
            ctx.to(out.dtype.element_ty),
            mask=head_ok[:, None],
        )
    else:
        # Natural-log LSE of the chunk; -inf for an empty one, whose partial stage 2 never reads.
        chunk_lse = tl.where(l_i > 0, (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse + b * stride_l_b + heads * stride_l_h + split, chunk_lse, mask=head_ok)
        if end > start:
            tl.store(
                partial + b * stride_p_b + heads[:, None] * stride_p_h + split * stride_p_s + offs_c[None, :],
                ctx,
                mask=head_ok[:, None],
            )


@triton.jit
def _mla_merge_splits(
    partial,
    lse,
    out,
    num_splits,
    stride_p_b,
    stride_p_h,
    stride_p_s,
    stride_l_b,
    stride_l_h,
    stride_o_b,
    stride_o_h,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[b, h, d-block] = the chunks' contexts weighted by exp(lse) / their sum. An empty chunk (lse -inf)
    weighs 0 and its partial is not read (never written); a request with no rows gets zeros."""
    pdl_prologue(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    chunk_lse = tl.load(lse + b * stride_l_b + h * stride_l_h + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    top = tl.max(chunk_lse, axis=0)
    top = tl.where(top > float("-inf"), top, 0.0)
    w = tl.exp2((chunk_lse - top) * 1.4426950408889634)  # log2(e); exp2(-inf) = 0
    part = tl.load(
        partial + b * stride_p_b + h * stride_p_h + offs_s[:, None] * stride_p_s + offs_d[None, :],
        mask=(w > 0)[:, None],
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    merged = tl.sum(w[:, None] * part, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out + b * stride_o_b + h * stride_o_h + offs_d, merged.to(out.dtype.element_ty))


def merge_splits(
    partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, config: MLADecodeConfig = DEFAULT_CONFIG
) -> torch.Tensor:
    """Stage 2 into `out` [bs, H, KV_LORA] (any dtype, contiguous rows): partial [bs, H, S, KV_LORA] fp32,
    lse [bs, H, S] (natural log; -inf: an empty chunk). Returns `out`."""
    bs, heads, splits, kv_lora = partial.shape
    if bs == 0:
        return out
    block_d = min(config.merge_block_d, kv_lora)
    pdl = pdl_available(partial)
    extra = {"num_warps": 4, "num_stages": 1, "launch_pdl": pdl} if partial.is_cuda else {}
    _mla_merge_splits[(bs, heads, triton.cdiv(kv_lora, block_d))](
        partial,
        lse,
        out,
        splits,
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_S=triton.next_power_of_2(splits),
        BLOCK_D=block_d,
        PDL=pdl,
        **extra,
    )
    return out


def mla_decode_fwd(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scaling: float,
    num_kv_splits: Optional[int] = None,
    config: MLADecodeConfig = DEFAULT_CONFIG,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """q_latent [bs, H, KV_LORA], q_rope [bs, H, ROPE], cache [slots, 1, KV_LORA + ROPE] -> latent context
    [bs, H, KV_LORA] in `out` (allocated in q_latent's dtype if None; any strides with contiguous rows), zeros for
    a request with no rows. KV_LORA must be a power of two (512 for DeepSeek). `num_kv_splits` None: the
    config's choice for bs rows (an explicit count is for tests and the benchmark's baseline)."""
    bs, heads, kv_lora = q_latent.shape
    rope = q_rope.shape[-1]
    if kv_lora & (kv_lora - 1) or kv_lora < 16:
        raise ValueError(f"the MLA decode kernel needs a power-of-two kv_lora_rank >= 16, got {kv_lora}")
    if cache.shape[-1] != kv_lora + rope or cache.stride(-1) != 1:
        raise ValueError(f"cache rows must be {kv_lora} + {rope} contiguous values, got {tuple(cache.shape)}")
    if out is None:
        out = torch.empty((bs, heads, kv_lora), dtype=q_latent.dtype, device=q_latent.device)
    if bs == 0:
        return out
    splits = num_kv_splits or config.num_splits(bs, heads, num_sms(q_latent.device))
    direct = splits == 1
    if direct:  # unused placeholders: stage 1 writes `out`
        partial, lse = out.new_empty((1, 1, 1, 1), dtype=torch.float32), out.new_empty((1, 1, 1), dtype=torch.float32)
    else:
        partial = torch.empty((bs, heads, splits, kv_lora), dtype=torch.float32, device=q_latent.device)
        lse = torch.empty((bs, heads, splits), dtype=torch.float32, device=q_latent.device)
    pdl = pdl_available(q_latent)
    extra = {} if not q_latent.is_cuda else {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if q_latent.is_cuda:
        extra["launch_pdl"] = pdl
    _mla_decode_stage1[(triton.cdiv(heads, config.block_h), bs, splits)](
        q_latent,
        q_rope,
        cache,
        kv_indptr,
        kv_indices,
        partial,
        lse,
        out,
        float(scaling) * 1.4426950408889634,  # log2(e): the kernel's softmax runs in base 2
        q_latent.stride(0),
        q_latent.stride(1),
        q_rope.stride(0),
        q_rope.stride(1),
        cache.stride(0),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        heads,
        KV_LORA=kv_lora,
        ROPE=rope,
        BLOCK_ROPE=max(16, triton.next_power_of_2(rope)),
        BLOCK_H=config.block_h,
        BLOCK_N=config.block_n,
        DIRECT=direct,
        WHILE_LOOPS=in_interpreter(q_latent),
        PDL=pdl,
        **extra,
    )
    if not direct:
        merge_splits(partial, lse, out, config)
    return out
