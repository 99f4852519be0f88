"""Where the decoder's elementwise steps (Gemma's norms, rotary with its q/k norms and KV store) take their triton
kernels: on CUDA tensors. The CPU takes the torch path, transformers' bits; tests patch ``runs_kernel`` to run the
kernels in the triton interpreter on CPU tensors, through a whole model. (Callers read it as
``kernel_dispatch.runs_kernel``, so the patch reaches them.)"""

from __future__ import annotations

import torch


def runs_kernel(t: torch.Tensor) -> bool:
    """The step on ``t`` runs its triton kernel (``fused_elementwise``)."""
    return t.is_cuda
