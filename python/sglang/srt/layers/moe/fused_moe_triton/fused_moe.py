"""Triton fused MoE for the GPU: tokens sorted by expert, two grouped GEMMs, weight-only dequant in-kernel.

Flow for x [T, H] routed to k experts each ("slots" s = t * k + j), four launches for a decode batch:
  1. moe_align_block_size: slot ids sorted by expert, each expert's run padded to BLOCK_M, so every
     BLOCK_M-row tile of the GEMM belongs to exactly one expert (one kernel, moe_align.py).
  2. GEMM 1: cache1[s] = x[s // k] @ w13[e].T                  [T*k, 2I]
  3. GEMM 2: cache2[s] = topk_weight[s] * act[s] @ w2[e].T     [T*k, H]
     with act[s] = silu(cache1[s, :I]) * cache1[s, I:] computed as GEMM 2 loads its A tiles
  4. out[t] = sum_j cache2[t * k + j] over the routed (id >= 0) slots only: one kernel, so cache2
     needs no zero-fill and the sum no separate cast
One token (T = 1) skips step 1: its k slots name k different experts, so each slot is a GEMM tile of its own; a
dense shared-experts MLP (DeepSeek's) may run there as more slots after the routed ones, reading its own weights
(SharedMLPWeights: the shared experts' GEMMs in the same launches as the routed ones').
Quantized weights are decoded tile by tile inside the GEMM (never to a full-precision copy of the
layer), so a layer's GPU memory is exactly its parameters plus these per-call activations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.configs.quantization_config import gpu_splits_scale_groups
from sglang.srt.layers.moe.fused_moe_triton.moe_align import AlignedRouting, moe_align_block_size
from sglang.srt.layers.moe.weight_format import MoEGemmWeight, SharedMLPWeights, WeightQuant
from sglang.srt.layers.pdl import pdl_available, pdl_prologue

# WeightQuant values as kernel-visible constants (triton only reads constexpr globals).
_Q_FP8: tl.constexpr = tl.constexpr(int(WeightQuant.FP8_BLOCK))
_Q_INT8: tl.constexpr = tl.constexpr(int(WeightQuant.INT8_CHANNEL))
_Q_INT4: tl.constexpr = tl.constexpr(int(WeightQuant.INT4_GROUP))
_Q_MXFP4: tl.constexpr = tl.constexpr(int(WeightQuant.MXFP4))
_Q_FP8_CHANNEL: tl.constexpr = tl.constexpr(int(WeightQuant.FP8_CHANNEL))

# Bounds the per-call activations (cache1 + act + cache2 ~ T*k*(3I + H) elements) for long prefills.
CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class MoEKernelConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class MoEGemmConfigs:
    """The two expert GEMMs' tile configs. Aligned routing pads each expert's run to one BLOCK_M that both GEMMs
    read, so they may differ in BLOCK_M only on the one-token path (no alignment)."""

    up: MoEKernelConfig  # gate/up: x @ w13[e].T
    down: MoEKernelConfig  # down: (silu(gate) * up) @ w2[e].T

    @staticmethod
    def both(config: MoEKernelConfig) -> MoEGemmConfigs:
        return MoEGemmConfigs(config, config)


# Decode (a few slots per expert): the weights are the traffic, so short M tiles. Chosen on the H200 by
# benchmark/decode_roofline/tune_fused_moe.py over 54 configs (tune_moe/): BLOCK_N 128, BLOCK_K 128, 4 warps,
# 3 stages won every cell (DeepSeek-V2-Lite bf16 and DeepSeek-V3 block-FP8 experts, 1 to 64 tokens), 1.28-1.42x
# faster than the earlier untuned BLOCK_N 64 / 4 stages; BLOCK_M 16 beat PREFILL_CONFIG by 1.38x and 1.36x at 3 and 6
# slots per expert (V2-Lite at 32 and 64 tokens), where the old rule (2 slots) had switched to it.
DECODE_CONFIG = MoEKernelConfig(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=3)
DECODE_SLOTS_PER_EXPERT = 8  # average routed slots per expert up to which DECODE_CONFIG runs
# One token's down GEMM, tuned alone (tune_fused_moe.py --per-gemm, tune_moe_per_gemm/): BLOCK_N 256 (half the
# programs, each computing its slot's SiLU-and-mul over K once per 256 output columns) ran V2-Lite's in 0.059 ms
# against DECODE_CONFIG's 0.091 (3 layers, H100); the gate/up GEMM keeps DECODE_CONFIG.
ONE_TOKEN_DOWN_CONFIG = MoEKernelConfig(block_m=16, block_n=256, block_k=128, num_warps=4, num_stages=3)
# One token's GEMMs over two-codes-a-byte weights (INT4 groups, MXFP4), tuned apart (tune_fused_moe.py --per-gemm
# --shapes Qwen3-30B-A3B-int4-g32, tune_moe_per_gemm/results.md): 256 inputs a K step (128 bytes a row) and 8 warps
# to decode them ran the gate/up GEMM in 0.210 ms against 0.318 and the down GEMM in 0.106 against 0.217 (9 layers,
# groups of 32, H100; the codes' decode, not their bytes, bounds these tiles); Qwen3-30B-A3B's int4 decode step at
# batch 1 4.884 -> 3.893 ms (groups of 128: 5.221 -> 3.876). MXFP4's, timed apart the same way (Qwen3-30B-A3B-mxfp4,
# H100): the best of the 36 for both GEMMs too (0.374 / 0.177 ms for 11 layers, 7.3-7.7x their bytes: decode-bound).
ONE_TOKEN_PACKED_CONFIG = MoEKernelConfig(block_m=16, block_n=128, block_k=256, num_warps=8, num_stages=3)
PACKED_MIN_BLOCK_K = 32  # INT4 / MXFP4: two dots of BLOCK_K / 2 a step (fit_scale_groups)
# Prefill: bigger M tiles reuse each weight tile over many tokens (untuned).
PREFILL_CONFIG = MoEKernelConfig(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3)


def fit_scale_groups(config: MoEKernelConfig, w: MoEGemmWeight) -> MoEKernelConfig:
    """The config's tiles fitted to the weight's scale groups. Block-fp8 groups narrower than BLOCK_K run with BLOCK_K
    = the group (one scale per output a K step). Two-codes-a-byte formats (INT4, MXFP4) keep BLOCK_K >= 32 (each of
    their two dots a K step spans half of it, and a dot's K is at least 16); their narrower power-of-two groups are
    applied a group at a time inside the tile (``tile_groups``), where a [BLOCK_K, BLOCK_N] per-element scale tile at
    the one-token down GEMM's BLOCK_N 256 asked more shared memory than the GPU has (344 KB for DeepSeek-V3's down
    GEMM in groups of 32 on an H100, 2026-12-06), and BLOCK_K = the group (its first fix) left 16-byte loads a row."""
    if w.packed:
        if config.block_k < PACKED_MIN_BLOCK_K:
            return dataclasses.replace(config, block_k=PACKED_MIN_BLOCK_K)
        return config
    if w.quant == WeightQuant.FP8_BLOCK and 16 <= w.group_k < config.block_k and w.group_k % 16 == 0:
        return dataclasses.replace(config, block_k=w.group_k)
    return config


def tile_groups(config: MoEKernelConfig, w: MoEGemmWeight) -> int:
    """Scale groups of a two-codes-a-byte weight in one K step where its groups are narrower than the step (applied a
    group at a time, the step split by them), else 1. Raises for a narrower group the kernel cannot split a step by
    (not a power of two of at least 16: none that a checkpoint or KTransformers ships)."""
    group = w.group_k
    if group >= config.block_k:
        return 1
    if not gpu_splits_scale_groups(group):
        raise ValueError(f"the fused MoE runs {w.quant.name} scale groups of a power of two >= 16, got {group}")
    return config.block_k // group


def default_configs(num_tokens: int, top_k: int, num_experts: int, packed: bool = False) -> MoEGemmConfigs:
    """`packed`: two codes a byte (INT4 groups, MXFP4), whose one-token GEMMs take their own tiles."""
    if num_tokens == 1:
        if packed:
            return MoEGemmConfigs.both(ONE_TOKEN_PACKED_CONFIG)
        return MoEGemmConfigs(DECODE_CONFIG, ONE_TOKEN_DOWN_CONFIG)
    if num_tokens * top_k <= DECODE_SLOTS_PER_EXPERT * num_experts:
        return MoEGemmConfigs.both(DECODE_CONFIG)
    return MoEGemmConfigs.both(PREFILL_CONFIG)


@triton.jit
def _load_a(a_ptr, a_rows, slot_mask, offs_k, K: tl.constexpr, stride_am, stride_ak, A_GATED: tl.constexpr):
    """A's [BLOCK_M, len(offs_k)] tile at columns offs_k of the slots' rows; with A_GATED, silu(gate) * up of the
    [gate | up] rows, computed as torch would as its own kernels: silu in fp32, times up, rounded once."""
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    a_mask = slot_mask[:, None] & (offs_k < K)[None, :]
    a = tl.load(a_ptrs, mask=a_mask, other=0.0)
    if A_GATED:
        gate = a.to(tl.float32)
        up = tl.load(a_ptrs + K * stride_ak, mask=a_mask, other=0.0).to(tl.float32)
        a = (gate / (1.0 + tl.exp(-gate)) * up).to(a_ptr.dtype.element_ty)
    return a


@triton.jit
def _decode_nibbles(nib, QUANT: tl.constexpr):
    """4-bit codes -> fp32 values: INT4 stores q + 8; MXFP4 e2m1 (e == 0 is subnormal: 0 or 0.5, otherwise
    (1 + m/2) * 2**(e-1)), bit 3 the sign."""
    if QUANT == _Q_INT4:
        return (nib - 8).to(tl.float32)
    e = (nib >> 1) & 3
    m = (nib & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * ((1 << e) >> 1).to(tl.float32))
    return tl.where((nib & 8) != 0, -mag, mag)


@triton.jit
def _group_scales(
    s_base, offs_n, offs_k, n_mask, k0, K: tl.constexpr, stride_sn, stride_sk,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, SCALE_K_PER_TILE: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    """The scales of the [len(offs_k), BLOCK_N] weight tile at inputs offs_k (from k0) and outputs offs_n, fp32: one
    per output where a group spans the tile (SCALE_K_PER_TILE: broadcast along K), else one per element."""
    if SCALE_K_PER_TILE:
        s = tl.load(s_base + (offs_n // GROUP_N) * stride_sn + (k0 // GROUP_K) * stride_sk, mask=n_mask, other=0)
        s = s[None, :]
    else:
        s = tl.load(
            s_base + (offs_n // GROUP_N)[None, :] * stride_sn + (offs_k // GROUP_K)[:, None] * stride_sk,
            mask=(offs_k < K)[:, None] & n_mask[None, :],
            other=0,
        )
    return _decode_scales(s, QUANT)


@triton.jit
def _decode_scales(s, QUANT: tl.constexpr):
    """Stored scales -> fp32 (MXFP4's e8m0 exponents: 2**(s - 127))."""
    if QUANT == _Q_MXFP4:
        return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    return s.to(tl.float32)


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, scale_ptr, c_ptr, topk_weights_ptr, sh_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_slots,
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_se, stride_sn, stride_sk,
    stride_cm, stride_cn,
    sh_stride_n,
    N: tl.constexpr,  # constexpr: fixed per layer (2I or H), and the interpreter needs static loop bounds
    K: tl.constexpr,
    A_ROW_DIV: tl.constexpr,  # A row of slot s is s // A_ROW_DIV (top_k for x, 1 for act)
    A_GATED: tl.constexpr,  # A is [gate | up] (2K wide): the GEMM reads silu(gate) * up, rounded to A's dtype
    MUL_ROUTED_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    SCALE_K_PER_TILE: tl.constexpr,  # GROUP_K is a multiple of BLOCK_K: one scale per column per tile
    TILE_GROUPS: tl.constexpr,  # two codes a byte: scale groups in a K step (tile_groups)
    DOT_PRECISION: tl.constexpr,
    ONE_TOKEN: tl.constexpr,  # no aligned routing: expert_ids_ptr is the token's top-k ids, tile m is slot m alone
    # One token: slots ROUTED_SLOTS .. + SH_COUNT - 1 read a dense shared MLP's weight at sh_ptr (SharedMLPWeights), each
    # SH_WIDTH wide; SH_GATED: its [gate; up] rows (the gate/up GEMM), else its columns (the down GEMM).
    ROUTED_SLOTS: tl.constexpr, SH_COUNT: tl.constexpr, SH_WIDTH: tl.constexpr, SH_GATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_prologue(PDL)  # the routing (sorted ids, expert ids) is the kernel before's output: nothing to prefetch
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    if ONE_TOKEN:
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        if expert < 0:  # a slot computed elsewhere (KT's CPU experts)
            return
        rows_in_tile = tl.arange(0, BLOCK_M)
        slots = pid_m + rows_in_tile
        slot_mask = rows_in_tile == 0
    else:
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        slot_mask = slots < num_slots
    a_rows = (slots // A_ROW_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N

    b_base = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
    if SH_COUNT > 0:
        if pid_m >= ROUTED_SLOTS:  # shared expert j: gate rows j*W.., up rows (count + j)*W..; or columns j*W..
            j = pid_m - ROUTED_SLOTS
            if SH_GATED:
                rows = tl.where(offs_n < SH_WIDTH, j * SH_WIDTH + offs_n, (SH_COUNT - 1 + j) * SH_WIDTH + offs_n)
                b_base = sh_ptr + rows[None, :].to(tl.int64) * sh_stride_n
            else:
                b_base = sh_ptr + offs_n[None, :].to(tl.int64) * sh_stride_n + (j * SH_WIDTH) * stride_bk
    s_base = scale_ptr + expert * stride_se
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Narrow scale groups (TILE_GROUPS > 1): the decoded weight is the MMA's left operand, as [BLOCK_N, BLOCK_K / 2]
    # (Hopper's wgmma reads its left operand from registers), the slots' rows its right.
    acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    w_rows = b_ptr + expert * stride_be + offs_n[:, None].to(tl.int64) * stride_bn
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kt * BLOCK_K
        if QUANT == _Q_INT4 or QUANT == _Q_MXFP4:
            # Two codes a byte, input 2j in the low nibble and 2j + 1 in the high: the byte tile is loaded once, whole
            # bytes along K, and its two nibble planes meet A's even and odd columns in two dots (read a byte per
            # input instead, the tile's loads were scalar and twice the bytes). Masked bytes decode to finite values
            # that meet A's zeros.
            offs_half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            offs_even = k0 + 2 * tl.arange(0, BLOCK_K // 2)
            if TILE_GROUPS > 1:
                half_mask = n_mask[:, None] & (offs_half < K // 2)[None, :]
                byte = tl.load(w_rows + offs_half[None, :] * stride_bk, mask=half_mask, other=0).to(tl.int32)
                # The step's [BLOCK_N, TILE_GROUPS] scales, each over GROUP_K / 2 columns of both nibble planes.
                offs_g = k0 // GROUP_K + tl.arange(0, TILE_GROUPS)
                groups = tl.load(
                    s_base + (offs_n // GROUP_N)[:, None] * stride_sn + offs_g[None, :] * stride_sk,
                    mask=n_mask[:, None] & (offs_g * GROUP_K < K)[None, :],
                    other=0,
                )
                groups = _decode_scales(groups, QUANT)[:, :, None]
                for odd in tl.static_range(2):
                    offs_k = offs_even + odd
                    w = _decode_nibbles((byte >> (4 * odd)) & 0xF, QUANT)
                    w = tl.reshape(
                        tl.reshape(w, (BLOCK_N, TILE_GROUPS, GROUP_K // 2)) * groups, (BLOCK_N, BLOCK_K // 2)
                    )
                    a = _load_a(a_ptr, a_rows, slot_mask, offs_k, K, stride_am, stride_ak, A_GATED)
                    acc_t += tl.dot(w.to(a.dtype), tl.trans(a), input_precision=DOT_PRECISION)
            else:  # a group spans the step (or a scale per element): the weight is the right operand
                half_mask = (offs_half < K // 2)[:, None] & n_mask[None, :]
                byte = tl.load(b_base + offs_half[:, None] * stride_bk, mask=half_mask, other=0).to(tl.int32)
                for odd in tl.static_range(2):
                    offs_k = offs_even + odd
                    w = _decode_nibbles((byte >> (4 * odd)) & 0xF, QUANT) * _group_scales(
                        s_base, offs_n, offs_k, n_mask, k0, K, stride_sn, stride_sk, GROUP_N, GROUP_K,
                        SCALE_K_PER_TILE, QUANT,
                    )  # fmt: skip
                    a = _load_a(a_ptr, a_rows, slot_mask, offs_k, K, stride_am, stride_ak, A_GATED)
                    acc += tl.dot(a, w.to(a.dtype), input_precision=DOT_PRECISION)
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = _load_a(a_ptr, a_rows, slot_mask, offs_k, K, stride_am, stride_ak, A_GATED)
            # Masked elements load as finite zeros so padding never injects NaN into the dot.
            w = tl.load(b_base + offs_k[:, None] * stride_bk, mask=(offs_k < K)[:, None] & n_mask[None, :], other=0.0)
            if QUANT == _Q_FP8:
                w = w.to(tl.float32) * _group_scales(
                    s_base, offs_n, offs_k, n_mask, k0, K, stride_sn, stride_sk, GROUP_N, GROUP_K,
                    SCALE_K_PER_TILE, QUANT,
                )  # fmt: skip
            acc += tl.dot(a, w.to(a.dtype), input_precision=DOT_PRECISION)
    if TILE_GROUPS > 1:
        acc = tl.trans(acc_t)

    if QUANT == _Q_INT8 or QUANT == _Q_FP8_CHANNEL:
        # Per-output-channel scale is constant along K: apply once instead of per tile.
        acc *= tl.load(s_base + offs_n * stride_sn, mask=n_mask, other=0.0)[None, :]
    if MUL_ROUTED_WEIGHT:
        acc *= tl.load(topk_weights_ptr + slots, mask=slot_mask, other=0.0)[:, None]
    c_ptrs = c_ptr + slots[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=slot_mask[:, None] & n_mask[None, :])


def _scale_strides(w: MoEGemmWeight) -> tuple[torch.Tensor, int, int, int]:
    if w.scale is None:
        return w.weight, 0, 0, 0  # any valid pointer; the kernel never reads it
    s = w.scale
    return s, s.stride(0), s.stride(1), (s.stride(2) if s.dim() == 3 else 0)


def invoke_moe_gemm(
    a: torch.Tensor,
    w: MoEGemmWeight,
    out: torch.Tensor,
    routing: AlignedRouting | torch.Tensor,
    num_slots: int,
    a_row_div: int,
    topk_weights: Optional[torch.Tensor],
    config: MoEKernelConfig,
    a_gated: bool = False,
    shared: Optional[tuple[torch.Tensor, int, int, bool]] = None,
) -> None:
    """out[s] = (topk_weights[s] *) a[s // a_row_div] @ w[expert(s)].T for every routed slot s; with
    `a_gated`, a is [gate | up] rows (2 * w.k wide) and the GEMM multiplies silu(gate) * up. `routing`: the
    slots aligned by expert (moe_align.py), or one token's top-k ids [k] (its slots name k different experts:
    each slot is a tile of its own, nothing to sort). `shared` (one token only): (a dense weight, its count of
    experts, their width, whether it is [gate; up] rows), read by the last `count` slots instead of w."""
    n, k = w.n, w.k
    config = fit_scale_groups(config, w)
    scale, s_e, s_n, s_k = _scale_strides(w)
    per_tile = w.group_k > 0 and w.group_k % config.block_k == 0
    one_token = isinstance(routing, torch.Tensor)
    if one_token:
        tiles, ids = num_slots, (routing, routing, routing)  # the top-k ids; the other two are never read
    else:
        tiles, ids = routing.expert_ids.numel(), (routing.sorted_slot_ids, routing.expert_ids, routing.num_padded)
    grid = (tiles * triton.cdiv(n, config.block_n),)
    sh_weight, sh_count, sh_width, sh_gated = shared if shared is not None else (w.weight, 0, 1, False)
    pdl = pdl_available(a)
    _moe_gemm_kernel[grid](
        a, w.weight, scale, out, topk_weights if topk_weights is not None else a, sh_weight,
        ids[0], ids[1], ids[2],
        num_slots,
        a.stride(0), a.stride(1),
        w.weight.stride(0), w.weight.stride(1), w.weight.stride(2),
        s_e, s_n, s_k,
        out.stride(0), out.stride(1),
        sh_weight.stride(0),
        N=n,
        K=k,
        A_ROW_DIV=a_row_div,
        A_GATED=a_gated,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        QUANT=int(w.quant),
        GROUP_N=max(w.group_n, 1),
        GROUP_K=max(w.group_k, 1),
        SCALE_K_PER_TILE=per_tile,
        TILE_GROUPS=tile_groups(config, w) if w.packed else 1,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        ONE_TOKEN=one_token,
        ROUTED_SLOTS=num_slots - sh_count, SH_COUNT=sh_count, SH_WIDTH=sh_width, SH_GATED=sh_gated,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, PDL=pdl,
        num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
    )  # fmt: skip


def _fused_experts_chunk(
    x: torch.Tensor,
    w13: MoEGemmWeight,
    w2: MoEGemmWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    configs: MoEGemmConfigs,
    shared: Optional[SharedMLPWeights] = None,
) -> torch.Tensor:
    num_tokens, top_k = topk_ids.shape
    num_slots = num_tokens * top_k
    up_shared = down_shared = None
    if shared is not None:  # one token: its last shared.count slots read the dense MLP (fused_experts_triton checks)
        up_shared = (shared.gate_up, shared.count, shared.width, True)
        down_shared = (shared.down, shared.count, shared.width, False)
    # One token (the batch-1 decode step): its k slots are k different experts, one tile each as aligned
    # routing would make them, so the align kernel is skipped (its launch is a step of the chain at every layer).
    if num_tokens == 1:
        routing = topk_ids.reshape(-1).contiguous()
    elif configs.up.block_m != configs.down.block_m:
        raise ValueError(f"aligned routing needs one BLOCK_M for both GEMMs, got {configs}")
    else:
        routing = moe_align_block_size(topk_ids, configs.up.block_m, w13.weight.shape[0])
    cache1 = torch.empty((num_slots, w13.n), dtype=x.dtype, device=x.device)
    invoke_moe_gemm(x, w13, cache1, routing, num_slots, top_k, None, configs.up, shared=up_shared)
    # Rows of skipped (-1) slots are garbage in both caches, but no GEMM tile and no sum reads them.
    cache2 = torch.empty((num_slots, w2.n), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    invoke_moe_gemm(cache1, w2, cache2, routing, num_slots, 1, weights, configs.down, a_gated=True, shared=down_shared)
    return moe_sum(cache2, topk_ids)


@triton.jit
def _moe_sum_kernel(
    cache_ptr, ids_ptr, out_ptr,
    stride_cm, stride_om, H,
    TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        slot = token * TOP_K + j
        routed = tl.load(ids_ptr + slot) >= 0  # a skipped slot's row was never written
        acc += tl.load(cache_ptr + slot * stride_cm + offs, mask=h_mask & routed, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=h_mask)


def moe_sum(cache: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """cache [T*k, H] -> out [T, H] = sum_j cache[t * k + j] over the slots with topk_ids >= 0, in fp32,
    rounded once to cache's dtype (tokens with no routed slot come out as exact zeros)."""
    num_tokens, top_k = topk_ids.shape
    hidden = cache.shape[1]
    out = torch.empty((num_tokens, hidden), dtype=cache.dtype, device=cache.device)
    block_h = min(1024, triton.next_power_of_2(hidden))
    pdl = pdl_available(cache)
    _moe_sum_kernel[(num_tokens, triton.cdiv(hidden, block_h))](
        cache, topk_ids.contiguous(), out,
        cache.stride(0), out.stride(0), hidden,
        TOP_K=top_k, BLOCK_H=block_h, PDL=pdl,
        num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    return out


def check_shared_slots(
    shared: SharedMLPWeights, w13: MoEGemmWeight, w2: MoEGemmWeight, tokens: int, slots: int
) -> None:
    """Raises unless `shared` can run as one token's last slots beside these experts: full-precision experts, the same
    dtype and expert width, K contiguous as theirs, and more slots than shared experts."""
    up, down, count = shared.gate_up, shared.down, shared.count
    if tokens > 1 or slots <= count or w13.quant != WeightQuant.NONE:
        raise ValueError(
            f"shared slots run at one token beside full-precision experts ({tokens} tokens, {slots} slots)"
        )
    if up.dtype != w13.weight.dtype or down.dtype != w2.weight.dtype:
        raise ValueError(f"the shared MLP is {up.dtype}, the experts {w13.weight.dtype}")
    if tuple(up.shape) != (count * w13.n, w13.k) or tuple(down.shape) != (w2.n, count * w2.k):
        raise ValueError(f"shared MLP [{tuple(up.shape)}, {tuple(down.shape)}] is not {count} experts of width {w2.k}")
    if up.stride(1) != w13.weight.stride(2) or down.stride(1) != w2.weight.stride(2):
        raise ValueError("the shared MLP's weights must be K-contiguous as the experts' are")


def fused_experts_triton(
    x: torch.Tensor,
    w13: MoEGemmWeight,
    w2: MoEGemmWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    configs: Optional[MoEGemmConfigs] = None,
    shared: Optional[SharedMLPWeights] = None,
) -> torch.Tensor:
    """x [T, H] -> [T, H]. topk_ids entries of -1 contribute nothing (experts computed elsewhere). `configs`:
    the GEMMs' tiles (default: `default_configs` per chunk). `shared`: one token only, a dense shared MLP run by the
    last `shared.count` slots of topk_ids / topk_weights (any ids >= 0 there; their weights multiply its output)."""
    num_tokens, top_k = topk_ids.shape
    if w13.k != x.shape[1] or w2.n != x.shape[1] or w13.n != 2 * w2.k:
        raise ValueError(f"weight shapes do not match: x {tuple(x.shape)}, w13 [{w13.n}, {w13.k}], w2 [{w2.n}, {w2.k}]")
    if shared is not None:
        check_shared_slots(shared, w13, w2, num_tokens, top_k)
    if num_tokens == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    outs = []
    for start in range(0, num_tokens, CHUNK_TOKENS):
        end = min(start + CHUNK_TOKENS, num_tokens)
        cfg = configs or default_configs(end - start, top_k, w13.weight.shape[0], w13.packed)
        outs.append(
            _fused_experts_chunk(x[start:end], w13, w2, topk_weights[start:end], topk_ids[start:end], cfg, shared)
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs)
