"""A skinny GEMM for decode, ``y[M, N] = x[M, K] @ w[N, K]^T (+ bias)`` with M (the batch) small.

At decode batch sizes the projections read their whole weight once per step and do little arithmetic on
it, so the step is bound by how fast the weights stream from HBM. cuBLAS picks tiles for compute-bound
shapes: measured on the H200 it spends 1.28x (qkv) and 1.58x (o_proj) of the weight-read floor at batch 1
(``benchmark/decode_roofline/gemms/``). Here each program owns a narrow slice of output columns
(``BLOCK_N``, as small as 16, so even a 4096-wide projection has hundreds of programs in flight) and
walks K in ``BLOCK_K`` steps with several loads in flight (``num_stages``). Launched with PDL while the kernel
before it runs, it streams its first tile and asks L2 for the front of its weight rows (``L2_PREFETCH_BYTES``)
before it waits for x. When N is too narrow to fill the GPU with wide tiles, ``SPLIT_K`` programs share one
column slice; each writes fp32 partial sums to a workspace and a second kernel adds them in a fixed order (no
atomics: the result does not depend on timing, so greedy outputs repeat exactly). Where the decoder's residual add
and RMSNorm come next (o_proj and down_proj), that kernel does them too, one program per row (``add_norm``), in place
of the norm's own kernel, and for a block-fp8 projection after the norm it writes the norm quantized for it
(``quantize``).

With fp8 operands (``--quantization fp8``: e4m3 weights with one scale per output row, activations with
one scale per row of x, ``quantization/fp8_linear.py``) the tiles go to the tensor cores as fp8 (Hopper's
wgmma takes e4m3 directly once BLOCK_N >= 64) and the epilogue multiplies each sum by its two scales, so
nothing is converted inside the K loop. A block-fp8 checkpoint's weights (one scale per 128x128 block,
activations quantized per token and 128-column group: ``quantization/fp8_block_linear.py``) take the same
fp8 tiles with BLOCK_K = 128: each K step's dot is one scale block, multiplied by its weight and activation
scales as it is added to the fp32 sum (DeepSeek-V3's recipe).

The tile sizes come from the tuned table (``table.py``); the kernel itself makes no choices.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.decode_gemm.table import GemmConfig, add_norm_refusal
from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue, release_dependents, wait_for_prerequisites
from sglang.srt.layers.quantization.block_fp8_activation import (
    ActivationLayout,
    BlockFp8Activation,
    empty_block_fp8_activation,
)
from sglang.srt.layers.quantization.fp8 import FP8_BLOCK as BLOCK_SCALE_EDGE
from sglang.srt.layers.quantization.fp8_tile import store_quantized_groups

# How much of a projection's weight the GEMM asks L2 for while it waits for the kernel before it (PDL), at most: the
# front of every program's K range, the same fraction of each. Set by bench_weight_prefetch.py (Qwen3-8B native
# block-fp8, results_weight_prefetch.md): on an H100 8 MiB took the batch-1 step from 3.968 to 3.851 ms (-2.9%),
# batch 8 -2.3%, batch 64 unchanged (on an H200 -0.6% at batch 1, also its best); more lost again (32 MiB +5%, the
# whole weight +21%: the prefetches then compete with the kernels still running for HBM and L2). About what HBM
# delivers in one kernel's launch and ramp-up.
L2_PREFETCH_BYTES = 8 * 1024**2


@triton.jit(do_not_specialize=["M", "k_tiles"])
def _skinny_gemm_kernel(
    X,
    W,
    Bias,
    XScale,
    WScale,
    Out,
    M,
    N,
    K,
    k_per_split,
    k_tiles,
    stride_xm,
    stride_wn,
    stride_om,
    stride_split,
    stride_xs,
    stride_ws,
    prefetch_k,
    HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    BLOCK_SCALED: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    IMPRECISE_ACC: tl.constexpr,
    WHILE_LOOPS: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    release_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k_start = pid_k * k_per_split
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_xm + (k_start + offs_k)[None, :]
    # GATED: the weight is [gate; up] (2N rows) and this program owns the same N columns of both halves.
    up_ptrs = w_ptrs + N * stride_wn
    # Accumulated as [N, M]: the weight tile is the MMA's left operand, so BLOCK_N can be 16 while the
    # batch rows (padded to BLOCK_M >= 16) ride along as the right operand.
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # GATED only (else never touched)
    first = 0
    if USE_PDL:  # launched while the kernel before runs: stream a weight tile, then wait for x (pdl.py)
        if PREFETCH:  # and ask L2 for the first prefetch_k columns of this program's rows meanwhile
            _prefetch_rows_to_l2(W, offs_n, N, stride_wn, k_start, K, prefetch_k)
            if GATED:
                _prefetch_rows_to_l2(W + N * stride_wn, offs_n, N, stride_wn, k_start, K, prefetch_k)
        w_mask = n_mask[:, None] & (k_start + offs_k < K)[None, :]
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        if GATED:
            w_up = tl.load(up_ptrs, mask=w_mask, other=0.0)
        wait_for_prerequisites(USE_PDL)
        x = tl.load(x_ptrs, mask=m_mask[:, None] & (k_start + offs_k < K)[None, :], other=0.0)
        if BLOCK_SCALED:
            acc = _add_block_scaled(
                acc, w, x, k_start // BLOCK_K, offs_n, offs_m, n_mask, m_mask, XScale, WScale, stride_xs, stride_ws,
                K, BLOCK_K, DOT_PRECISION, IMPRECISE_ACC,
            )  # fmt: skip
        else:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION, max_num_imprecise_acc=IMPRECISE_ACC)
        if GATED:
            acc_up = tl.dot(
                w_up, tl.trans(x), acc_up, input_precision=DOT_PRECISION, max_num_imprecise_acc=IMPRECISE_ACC
            )
        w_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        first = 1
    # Every split walks k_tiles tiles; only the last split's tail is masked off.
    if WHILE_LOOPS:  # the interpreter (CPU tests): see kernel_dispatch
        i = 0
        while i < k_tiles:
            k_mask = k_start + i * BLOCK_K + offs_k < K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            acc = _k_step(
                acc, w_ptrs, x, k_mask, k_start // BLOCK_K + i, offs_n, offs_m, n_mask, m_mask, XScale, WScale,
                stride_xs, stride_ws, K, BLOCK_SCALED, BLOCK_K, DOT_PRECISION, IMPRECISE_ACC,
            )  # fmt: skip
            if GATED:  # the same x tile against the up half's weight tile
                acc_up = _accumulate_tile(acc_up, up_ptrs, x, k_mask, n_mask, DOT_PRECISION, IMPRECISE_ACC)
            w_ptrs += BLOCK_K
            up_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
            i += 1
    else:
        for i in range(first, k_tiles):
            k_mask = k_start + i * BLOCK_K + offs_k < K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            acc = _k_step(
                acc, w_ptrs, x, k_mask, k_start // BLOCK_K + i, offs_n, offs_m, n_mask, m_mask, XScale, WScale,
                stride_xs, stride_ws, K, BLOCK_SCALED, BLOCK_K, DOT_PRECISION, IMPRECISE_ACC,
            )  # fmt: skip
            if GATED:
                acc_up = _accumulate_tile(acc_up, up_ptrs, x, k_mask, n_mask, DOT_PRECISION, IMPRECISE_ACC)
            w_ptrs += BLOCK_K
            up_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
    if SCALED:  # fp8 operands: undo both scales (linear, so split-K partials may be scaled apart)
        w_scale = tl.load(WScale + offs_n, mask=n_mask, other=0.0)
        x_scale = tl.load(XScale + offs_m, mask=m_mask, other=0.0)
        acc = acc * w_scale[:, None] * x_scale[None, :]
        if GATED:
            up_scale = tl.load(WScale + N + offs_n, mask=n_mask, other=0.0)
            acc_up = acc_up * up_scale[:, None] * x_scale[None, :]
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        if GATED:
            acc_up += tl.load(Bias + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    if GATED:  # SiLU-and-mul on the fp32 sums: silu(gate) * up
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    out_ptrs = Out + pid_k * stride_split + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _prefetch_rows_to_l2(W, offs_n, N, stride_wn, k_start, K, prefetch_k):
    """One bulk L2 prefetch per weight row of the program (Hopper's ``cp.async.bulk.prefetch``, a hint: nothing is
    loaded into registers and nothing waits for it) of columns [k_start, k_start + prefetch_k), cut at K. Rows past N
    repeat the last row (a prefetch outside the tensor is never issued). The caller keeps every row's start and
    length a multiple of 16 bytes (``prefetch_columns``)."""
    elem_bytes: tl.constexpr = W.dtype.element_ty.primitive_bitwidth // 8
    columns = tl.minimum(prefetch_k, K - k_start)
    if columns > 0:
        rows = tl.minimum(offs_n, N - 1).to(tl.int64)
        ptrs = W + rows * stride_wn + k_start
        nbytes = tl.full(offs_n.shape, 0, tl.int32) + columns * elem_bytes
        tl.inline_asm_elementwise(
            "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
            "=r,l,r",
            [ptrs, nbytes],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def _add_block_scaled(
    acc, w, x, kb, offs_n, offs_m, n_mask, m_mask, XScale, WScale, stride_xs, stride_ws,
    K, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, IMPRECISE_ACC: tl.constexpr,
):  # fmt: skip
    """acc += (w @ x^T) x the step's scales: x's row scales of 128-column group kb ([M, K/128]) and the weight's
    scale of block (row // 128, kb) ([N/128, K/128]); one K step (BLOCK_K = 128) is one scale block. A step wholly
    past K (the last split's masked tail tiles, where the splits' tiles outnumber K's) adds nothing: its scale
    indices run past a row of the scale tensors (past the end of them for the last row), and whatever is read
    there, NaN included, times the step's zero dot would not be zero."""
    live = kb * BLOCK_K < K
    w_scale = tl.load(WScale + (offs_n // BLOCK_K) * stride_ws + kb, mask=n_mask & live, other=0.0)
    x_scale = tl.load(XScale + offs_m * stride_xs + kb, mask=m_mask & live, other=0.0)
    part = tl.dot(w, tl.trans(x), input_precision=DOT_PRECISION, max_num_imprecise_acc=IMPRECISE_ACC)
    return acc + part * w_scale[:, None] * x_scale[None, :]


@triton.jit
def _k_step(
    acc, w_ptrs, x, k_mask, kb, offs_n, offs_m, n_mask, m_mask, XScale, WScale, stride_xs, stride_ws, K,
    BLOCK_SCALED: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, IMPRECISE_ACC: tl.constexpr,
):  # fmt: skip
    """One K step of the main weight: the tile at w_ptrs against x's tile (its scale block kb when BLOCK_SCALED)."""
    if BLOCK_SCALED:
        w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        return _add_block_scaled(
            acc, w, x, kb, offs_n, offs_m, n_mask, m_mask, XScale, WScale, stride_xs, stride_ws,
            K, BLOCK_K, DOT_PRECISION, IMPRECISE_ACC,
        )  # fmt: skip
    return _accumulate_tile(acc, w_ptrs, x, k_mask, n_mask, DOT_PRECISION, IMPRECISE_ACC)


@triton.jit
def _accumulate_tile(acc, w_ptrs, x, k_mask, n_mask, DOT_PRECISION: tl.constexpr, IMPRECISE_ACC: tl.constexpr):
    """acc += (the weight tile at w_ptrs) @ x^T, for one K step's x tile (loaded once per step)."""
    w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    return tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION, max_num_imprecise_acc=IMPRECISE_ACC)


@triton.jit
def _sum_splits_kernel(
    Partials,
    Bias,
    Residual,
    NormWeight,
    Addend,
    Out,
    QOut,
    QScale,
    N,
    n_rows,
    stride_split,
    stride_om,
    stride_res,
    stride_add,
    stride_q,
    stride_qs_row,
    stride_qs_group,
    eps,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ADD_NORM: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
    QUANTIZE: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    m = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    # Rows past n_rows: QUANTIZE's padding rows (zero codes, the smallest scale), nothing else read or written.
    mask = (offs < N) & (m < n_rows)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # fixed order: the same sum on every run
        acc += tl.load(Partials + s * stride_split + m * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(Bias + offs, mask=mask, other=0.0).to(tl.float32)
    if ADD_NORM:  # one program per row: the residual add and RMSNorm after the GEMM, rounded as rmsnorm() does
        y = acc.to(Out.dtype.element_ty).to(tl.float32)  # the GEMM's own output, as the norm kernel would read it
        if HAS_ADDEND:  # y + addend rounded as torch's add of the two outputs would be, before the residual
            y = y + tl.load(Addend + m * stride_add + offs, mask=mask, other=0.0).to(tl.float32)
            y = y.to(Out.dtype.element_ty).to(tl.float32)
        res_ptrs = Residual + m * stride_res + offs
        h = (y + tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)).to(Residual.dtype.element_ty)
        tl.store(res_ptrs, h, mask=mask)
        hf = h.to(tl.float32)
        normed = (hf * tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps)).to(Residual.dtype.element_ty)
        acc = tl.load(NormWeight + offs, mask=mask, other=0.0).to(tl.float32) * normed.to(tl.float32)
    if QUANTIZE:  # (ADD_NORM only: one program per row) the normed row as the block-fp8 projection after takes it
        v = acc.to(Out.dtype.element_ty).to(tl.float32)
        store_quantized_groups(
            v, 0, N, QOut + m * stride_q, QScale + m * stride_qs_row, stride_qs_group, BLOCK, ROUND_BY_HAND
        )
    else:
        tl.store(Out + m * stride_om + offs, acc.to(Out.dtype.element_ty), mask=mask)


def prefetch_columns(weight: torch.Tensor, k_per_split: int, use_pdl: bool) -> int:
    """Columns of each program's K range whose weight rows the GEMM prefetches into L2 before it waits (a multiple
    of 16, so every bulk prefetch spans whole 16-byte units): 0 without PDL or where a row's start or length is not
    16-byte aligned, else the share of ``L2_PREFETCH_BYTES`` in the whole weight."""
    elem = weight.element_size()
    rows, k = weight.shape
    if not use_pdl or weight.data_ptr() % 16 or (weight.stride(0) * elem) % 16 or (k * elem) % 16:
        return 0
    fraction = min(1.0, L2_PREFETCH_BYTES / (rows * k * elem))
    return int(k_per_split * fraction) // 16 * 16


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    config: GemmConfig,
    scales: Optional[tuple[torch.Tensor, torch.Tensor, torch.dtype]] = None,
    silu_and_mul: bool = False,
    add_norm: Optional[tuple[torch.Tensor, torch.Tensor, float]] = None,
    block_scales: Optional[tuple[torch.Tensor, torch.Tensor, torch.dtype]] = None,
    addend: Optional[torch.Tensor] = None,
    quantize: Optional[ActivationLayout] = None,
) -> torch.Tensor | BlockFp8Activation:
    """``F.linear(x, weight, bias)`` for a 2-D ``x`` whose rows and ``weight``'s rows are K-contiguous.

    ``scales`` = (x_scale [M, 1], weight_scale [N, 1], out dtype) for fp8 ``x`` and ``weight``:
    ``F.linear(x * x_scale, weight * weight_scale, bias)`` in the out dtype.
    ``silu_and_mul``: ``weight`` is [gate; up] (a merged gate_up projection) and the result is
    ``silu(gate) * up`` ([M, N / 2]), applied to the fp32 sums in the epilogue (``config.split_k`` must be 1:
    partial sums cannot go through the activation).
    ``add_norm`` = (residual [M, N], norm weight [N], eps), split-K configs only: what the decoder does next,
    ``fused_elementwise.rmsnorm(y, weight, eps, residual=residual)``, done by the split-K sum kernel (one
    program per row): residual += y in place and the result is the RMSNorm of that sum, rounded at the same
    points as the norm kernel (the same bits). ``addend`` [M, N] (with ``add_norm`` only): another output added to
    the product before the residual, as ``rmsnorm(y + addend, ...)`` rounds it (DeepSeek's routed experts beside
    the shared experts' down_proj).
    ``block_scales`` = (x_scale [M, ceil(K/128)] with contiguous rows, weight_scale [ceil(N/128), ceil(K/128)]
    with contiguous rows, out dtype) for fp8 ``x`` quantized per token and 128-column group and a block-fp8
    ``weight``: the block-scaled product (``fp8_block_linear.block_fp8_matmul_reference``) in the out dtype;
    ``config.block_k`` must be 128 (one K step, one scale block); ``add_norm`` (and ``addend``) as above: the split-K
    partials are scaled as they are summed, so the sum kernel adds them as it adds unscaled ones.
    ``quantize`` (with ``add_norm`` only): the sum kernel hands the norm's output to a block-fp8 projection after it,
    quantized per token and 128-column group in that layout (``BlockFp8Activation``; the same bits as the norm's
    output through ``fp8_block_kernels.quantize_groups``) instead of writing it in the out dtype."""
    if block_scales is not None:
        if scales is not None or silu_and_mul or config.block_k != BLOCK_SCALE_EDGE:
            raise ValueError(
                f"block_scales need block_k {BLOCK_SCALE_EDGE} and neither scales nor silu_and_mul, got {config}"
            )
        scales = block_scales
    m, k = x.shape
    n = weight.shape[0] // 2 if silu_and_mul else weight.shape[0]
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != k:
        raise ValueError(f"skinny_linear needs K-contiguous x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if silu_and_mul and (config.split_k != 1 or weight.shape[0] % 2):
        raise ValueError(
            f"silu_and_mul needs split_k 1 and an even number of weight rows, got {config}, {weight.shape}"
        )
    split_k, k_per_split = config.k_split(k)
    if add_norm is not None:
        per_channel = scales is not None and block_scales is None  # block-scaled partials are sums already
        refusal = add_norm_refusal(config, m, k, n, add_norm[0], add_norm[1], per_channel, silu_and_mul, addend)
        if refusal is not None:
            raise ValueError(refusal)
    elif addend is not None or quantize is not None:
        raise ValueError("addend and quantize need add_norm")
    out = torch.empty(m, n, device=x.device, dtype=x.dtype if scales is None else scales[2])
    quantized = None if quantize is None else empty_block_fp8_activation(m, n, out.dtype, quantize, x.device)
    if m == 0:
        return out if quantized is None else quantized
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, config.block_m), split_k)
    fused_bias = bias is not None and split_k == 1
    pdl = pdl_available(x)  # the split-K sum below launches with PDL whatever the config says
    use_pdl = config.pdl and pdl
    target = out if split_k == 1 else torch.empty(split_k, m, n, device=x.device, dtype=torch.float32)
    prefetch_k = prefetch_columns(weight, k_per_split, use_pdl)
    _skinny_gemm_kernel[grid](
        x,
        weight,
        bias if fused_bias else out,  # a dummy pointer when there is no bias: never read
        out if scales is None else scales[0],  # dummies unless SCALED, likewise
        out if scales is None else scales[1],
        target,
        m,
        n,
        k,
        k_per_split,
        k_per_split // config.block_k,
        x.stride(0),
        weight.stride(0),
        target.stride(-2),
        target.stride(0) if split_k > 1 else 0,
        block_scales[0].stride(0) if block_scales is not None else 0,
        block_scales[1].stride(0) if block_scales is not None else 0,
        prefetch_k,
        HAS_BIAS=fused_bias,
        SCALED=scales is not None and block_scales is None,
        BLOCK_SCALED=block_scales is not None,
        GATED=silu_and_mul,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32 (CPU tests): exact products
        # Hopper's fp8 MMA adds into a narrower accumulator; triton lets it run over all of K by default.
        # Moving the sum to fp32 every 128 products keeps it as exact as _scaled_mm's (DeepSeek-V3's
        # interval); bf16 dots accumulate in fp32 already.
        IMPRECISE_ACC=min(128, config.block_k) if scales is not None else None,
        WHILE_LOOPS=in_interpreter(x),
        USE_PDL=use_pdl,
        PREFETCH=prefetch_k > 0,
        launch_pdl=use_pdl,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if split_k > 1:
        # add_norm: a program per row, as wide as the norm kernel's (and as many warps: the same reduction)
        block = triton.next_power_of_2(n) if add_norm is not None else 1024
        if quantized is not None:  # whole 128-column groups a program
            block = max(block, BLOCK_SCALE_EDGE)
        q_out, q_scale = (quantized.q, quantized.scale) if quantized is not None else (out, out)
        _sum_splits_kernel[(m if quantized is None else q_out.shape[0], triton.cdiv(n, block))](
            target,
            bias if bias is not None else out,
            add_norm[0] if add_norm is not None else out,  # dummies unless ADD_NORM
            add_norm[1] if add_norm is not None else out,
            addend if addend is not None else out,
            out,
            q_out,  # dummies unless QUANTIZE
            q_scale,
            n,
            m,
            target.stride(0),
            out.stride(0),
            add_norm[0].stride(0) if add_norm is not None else 0,
            addend.stride(0) if addend is not None else 0,
            q_out.stride(0),
            *q_scale.stride(),
            add_norm[2] if add_norm is not None else 0.0,
            SPLIT_K=split_k,
            BLOCK=block,
            HAS_BIAS=bias is not None,
            ADD_NORM=add_norm is not None,
            HAS_ADDEND=addend is not None,
            QUANTIZE=quantized is not None,
            ROUND_BY_HAND=in_interpreter(x),
            PDL=pdl,
            launch_pdl=pdl,
            num_warps=(4 if n <= 1024 else 8) if add_norm is not None else 4,
        )
        if quantized is not None:
            return quantized
    return out
