"""The router's logits, ``F.linear(x.float(), weight)`` with an fp32 weight (DeepSeek's and GLM-4.5's routers keep
theirs in fp32, as the reference computes them), in one triton kernel on the GPU.

torch needs three launches for it in a decode step's graph: the cast of the bf16 activations to fp32, then
cuBLAS's fp32 GEMM, which at decode sizes runs as a GEMV or a split-K GEMM plus its reduction kernel (the
DeepSeek-V2-Lite profile, ``benchmark/decode_roofline/profile_deepseek_v2_lite.md``: 78 launches a step at batch
1). Here one kernel reads the activations in their own dtype and sums exact fp32 products (``ieee`` dots, no
TF32), like cuBLAS's fp32 GEMM, in another order: logits agree to fp32 rounding.

A program per (expert block, token): an fp32 multiply-and-sum over K; each token reads the weight again, from L2
after the first. Where it runs, and its tile, are measured (``benchmark/decode_roofline/bench_router_logits.py``,
H100, 2026-12-05, ``results_router_logits_h100.md``: each step's routers after their norms in one CUDA graph). With
one expert a program and 2,048 columns a step it takes, against torch's cast and cuBLAS's fp32 GEMM, for
DeepSeek-V2-Lite's router (64 x 2048, 0.5 MiB) 0.37x the time at one token (norms included) and 0.61x at 64; for
DeepSeek-V3's (256 x 7168, 7 MiB) 0.71x at one token, 0.39-0.48x at 2-8 and 0.79x at 16, but 1.68x at 32 and 2.98x at
64, where every token re-reading the weight from L2 (tokens x 7 MiB) costs more than cuBLAS's one read. The first
tile (8 experts, 512 columns: 32 programs a token for V3, most SMs idle) took 2.4x torch's time for V3 at one
token. So the kernel takes up to ``KERNEL_MAX_TOKENS`` tokens while tokens x weight bytes stay within
``KERNEL_MAX_L2_BYTES`` (V2-Lite to 64 tokens, V3 to 18; GLM-4.5-Air's 128 x 4096 router to 64 and GLM-4.5's
160 x 5120 to 40, not measured: between the two); everything else takes torch. The token count is a host int: a
captured graph keeps its path.

A tiled form for more tokens (a program per 16 experts x 16 tokens, tile dots over K, up to 512 tokens) was dropped:
with it V2-Lite's decode step at batch 64 took 14.284 ms against 13.647 ms for the tree before the launch cuts of
c09b426, without it 13.491 against 13.642 (H100, 2026-12-05, two calls, ``run.sh before:roofline-mla roofline-mla``;
``benchmark/decode_roofline/results_deepseek_v2_lite_h100.md``): at 64 tokens it is 16 programs of 32 dependent K
steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sglang.srt.layers.kernel_dispatch import in_interpreter
from sglang.srt.layers.pdl import pdl_available, pdl_prologue

# The kernel's domain (measured, above): up to 64 tokens, and tokens x router weight bytes (the weight re-read from L2
# by every token) up to 128 MiB.
KERNEL_MAX_TOKENS = 64
KERNEL_MAX_L2_BYTES = 128 << 20


@dataclass(frozen=True)
class RouterTile:
    """A program's share of one token's logits: ``experts`` rows of the weight, read ``block_k`` columns a step."""

    experts: int
    block_k: int


DEFAULT_TILE = RouterTile(experts=1, block_k=2048)  # measured against (8, 512), (4, 1024), (2, 1024): above


@triton.jit
def _router_logits_kernel(
    X,
    W,
    Out,
    num_experts,
    K,
    stride_x,
    stride_w,
    stride_o,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WHILE_LOOPS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    # one token: acc[e] = sum_k w[e, k] * x[k]
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = offs_e < num_experts
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = W + offs_e[:, None].to(tl.int64) * stride_w
    t = tl.program_id(1)
    acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
    k0 = 0
    if WHILE_LOOPS:  # the interpreter: see kernel_dispatch
        while k0 < K:
            acc += _gemv_step(X, w_rows, t, stride_x, k0, offs_k, e_ok, K)
            k0 += BLOCK_K
    else:
        for k0 in range(0, K, BLOCK_K):
            acc += _gemv_step(X, w_rows, t, stride_x, k0, offs_k, e_ok, K)
    tl.store(Out + t * stride_o + offs_e, acc, mask=e_ok)


@triton.jit
def _gemv_step(X, w_rows, t, stride_x, k0, offs_k, e_ok, K):
    k_ok = k0 + offs_k < K
    x = tl.load(X + t * stride_x + k0 + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    w = tl.load(w_rows + (k0 + offs_k)[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
    return tl.sum(w * x[None, :], axis=1)


def router_logits_triton(x: torch.Tensor, weight: torch.Tensor, tile: RouterTile = DEFAULT_TILE) -> torch.Tensor:
    """x [T, K] (rows K-contiguous, any float dtype), weight [E, K] fp32 contiguous -> fp32 logits [T, E]."""
    num_tokens, k = x.shape
    num_experts = weight.shape[0]
    if weight.dtype != torch.float32 or weight.shape[1] != k or weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"router logits need K-contiguous x {tuple(x.shape)} and an fp32 weight [E, {k}]")
    out = torch.empty((num_tokens, num_experts), dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return out
    grid = (triton.cdiv(num_experts, tile.experts), num_tokens)
    pdl = pdl_available(x)
    _router_logits_kernel[grid](
        x,
        weight,
        out,
        num_experts,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BLOCK_E=tile.experts,
        BLOCK_K=tile.block_k,
        WHILE_LOOPS=in_interpreter(x),
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )
    return out


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits of x [T, K] under an fp32 router weight [E, K]: the kernel on CUDA where it was measured faster
    (up to KERNEL_MAX_TOKENS tokens, tokens x weight bytes up to KERNEL_MAX_L2_BYTES), torch elsewhere."""
    tokens = x.shape[0]
    rereads_fit = tokens * weight.numel() * weight.element_size() <= KERNEL_MAX_L2_BYTES
    if x.is_cuda and x.dim() == 2 and x.stride(1) == 1 and tokens <= KERNEL_MAX_TOKENS and rereads_fit:
        return router_logits_triton(x, weight)
    return F.linear(x.float(), weight)
