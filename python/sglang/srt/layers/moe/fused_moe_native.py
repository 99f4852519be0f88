"""Torch MoE: the reference implementation and the CPU path. Works on any device."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

# expert id -> (w13 [2I, H], w2 [H, I]) in a float dtype; dequantized on demand so only one
# expert's full-precision copy exists at a time.
ExpertWeights = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def fused_moe_native(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_weights: ExpertWeights,
    compute_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """x [T, H], topk_weights [T, k], topk_ids [T, k] (-1 = slot handled elsewhere) -> [T, H].

    out[t] = sum_j w[t, j] * W2_e (silu(W1_e x_t) * (W3_e x_t)), e = ids[t, j]. The expert GEMMs run
    in compute_dtype (fp32 by default: the reference); the mixture always sums in fp32. The KT CPU
    experts pass the model's dtype, as the GPU kernel computes: a bf16 GEMM on the host is several
    times faster than upcasting every expert's weights to fp32 on every call.
    """
    cd = compute_dtype or torch.float32
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    flat_weights = topk_weights.reshape(-1).float()
    top_k = topk_ids.shape[-1]
    for expert in torch.unique(flat_ids).tolist():
        if expert < 0:
            continue
        slots = torch.nonzero(flat_ids == expert).squeeze(1)
        tokens = slots // top_k
        w13, w2 = expert_weights(expert)
        inter = w13.shape[0] // 2
        h = x[tokens].to(cd) @ w13.to(cd).t()
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = (act @ w2.to(cd).t()).float() * flat_weights[slots, None]
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)
