"""MLA's two per-head projections around the latent attention at decode sizes: ``y[t, h] = x[t, h] @ w[h]`` for every
head h, with w[h] a [K, N] matrix of any strides (W_UK absorbed into the query: [nope, kv_lora] rows of kv_b_proj;
W_UV after the attention: the same rows read transposed).

torch.bmm runs these on cuBLAS, whose kernels wait for the whole kernel before them and cannot be launched early
(PDL, ``layers/pdl.py``): two breaks a layer in a decode step otherwise launched with PDL end to end, the one before
o_proj costing the skinny GEMM its early weight stream. This kernel is launched with PDL and streams its first weight
tile before it waits (the weights are never written during a forward). One program per (head, BLOCK_N columns,
BLOCK_T tokens); K steps of BLOCK_K, unrolled (K is the head's 128 or 512 values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang.srt.layers.pdl import pdl_available, release_dependents, wait_for_prerequisites

# Tokens up to which the decode path takes this kernel (a decode graph's batch sizes); above, torch.bmm. Not timed
# against cuBLAS yet (docs/gpu_test_runs.md, "The GPU queue", item 7).
HEAD_MATMUL_MAX_TOKENS = 64


@triton.jit
def head_matmul_tile(
    X,
    W,
    Y,
    T,
    stride_xt,
    stride_xh,
    stride_wh,
    stride_wk,
    stride_wn,
    stride_yt,
    stride_yh,
    head,
    n_block,
    t_block,
    K: tl.constexpr,
    N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program's tile: head `head`, columns n_block * BLOCK_N.., tokens t_block * BLOCK_T... Waits for the
    kernel before (PDL) after its first weight tile is loaded; the caller releases its dependents."""
    head = head.to(tl.int64)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = t_block * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    t_mask = offs_t < T
    w_ptrs = W + head * stride_wh + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    x_ptrs = X + head * stride_xh + offs_t[:, None].to(tl.int64) * stride_xt + offs_k[None, :]
    w = tl.load(w_ptrs, mask=(offs_k < K)[:, None] & n_mask[None, :], other=0.0)  # before the wait: never written
    wait_for_prerequisites(PDL)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        k_mask = k0 + offs_k < K
        if k0 > 0:
            w = tl.load(w_ptrs + k0 * stride_wk, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        x = tl.load(x_ptrs + k0, mask=t_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    y_ptrs = Y + head * stride_yh + offs_t[:, None].to(tl.int64) * stride_yt + offs_n[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=t_mask[:, None] & n_mask[None, :])


@triton.jit
def _head_matmul_kernel(
    X,
    W,
    Y,
    T,
    stride_xt,
    stride_xh,
    stride_wh,
    stride_wk,
    stride_wn,
    stride_yt,
    stride_yh,
    K: tl.constexpr,
    N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    release_dependents(PDL)
    head_matmul_tile(
        X, W, Y, T, stride_xt, stride_xh, stride_wh, stride_wk, stride_wn, stride_yt, stride_yh,
        tl.program_id(0), tl.program_id(1), tl.program_id(2), K, N, BLOCK_T, BLOCK_N, BLOCK_K, DOT_PRECISION, PDL,
    )  # fmt: skip


@dataclass(frozen=True)
class HeadMatmul:
    """The operands of one head matmul: x [T, H, K] (contiguous last dim), w [H, K, N] (any strides), out [T, H, N]
    (contiguous last dim), checked. ``launch`` gives its tiling; another kernel may run its tiles as extra
    programs (the rotary kernel runs MLA's query absorption so: ``fused_elementwise.apply_rotary_inplace``)."""

    x: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor

    def __post_init__(self) -> None:
        tokens, heads, k = self.x.shape
        if tuple(self.w.shape[:2]) != (heads, k) or self.x.stride(2) != 1:
            raise ValueError(
                f"head_matmul wants x [T, H, K] with contiguous rows and w [H, K, N], got {self.x.shape}, {self.w.shape}"
            )
        if tuple(self.out.shape) != (tokens, heads, self.w.shape[2]) or self.out.stride(2) != 1:
            raise ValueError(
                f"head_matmul's out must be [{tokens}, {heads}, {self.w.shape[2]}] with a contiguous last dim"
            )

    def launch(self) -> dict:
        """Tile sizes (the kernels' constexprs) and the tile grid (heads, column blocks, token blocks)."""
        tokens, heads, k = self.x.shape
        n = self.w.shape[2]
        block_t = min(64, max(16, triton.next_power_of_2(tokens)))
        block_n = 64 if n >= 256 else 32
        return dict(
            grid=(heads, triton.cdiv(n, block_n), triton.cdiv(tokens, block_t)),
            K=k,
            N=n,
            BLOCK_T=block_t,
            BLOCK_N=block_n,
            BLOCK_K=min(128, triton.next_power_of_2(k)),
            DOT_PRECISION="ieee" if self.x.dtype == torch.float32 else "tf32",  # fp32 (CPU tests): exact products
        )

    def strides(self) -> tuple[int, ...]:
        """stride_xt, stride_xh, stride_wh, stride_wk, stride_wn, stride_yt, stride_yh: the tile's stride arguments."""
        x, w, y = self.x, self.w, self.out
        return x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), y.stride(0), y.stride(1)

    def reference(self) -> torch.Tensor:
        """The product in torch (the CPU's path where no kernel runs), written into ``out``."""
        return self.out.copy_(torch.einsum("thk,hkn->thn", self.x, self.w))


def head_matmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H, K] (contiguous last dim), w [H, K, N] (any strides) -> [T, H, N] (in ``out`` if given: any strides
    with a contiguous last dim), each head's rows times its own matrix, summed in fp32 and rounded once."""
    if out is None:
        out = torch.empty((x.shape[0], x.shape[1], w.shape[-1]), dtype=x.dtype, device=x.device)
    product = HeadMatmul(x, w, out)
    if x.shape[0] == 0:
        return out
    tiles = product.launch()
    pdl = pdl_available(x)
    extra = {"num_warps": 4, "num_stages": 2, "launch_pdl": pdl} if x.is_cuda else {}
    _head_matmul_kernel[tiles.pop("grid")](x, w, out, x.shape[0], *product.strides(), PDL=pdl, **tiles, **extra)
    return out
