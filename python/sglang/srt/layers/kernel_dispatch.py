"""Where the project's triton kernels run, and in what form.

The decoder's elementwise steps (the RMSNorms, Llama's and Gemma's, SiLU-and-mul, rotary with its q/k norms and KV
store) take their kernels on CUDA tensors (``runs_kernel``), and so do the routed experts (``runs_moe_kernel``); the CPU
takes the torch path, transformers' bits. Tests patch either to run those kernels in the triton interpreter on CPU
tensors, through a whole model (callers read them as ``kernel_dispatch.<name>``, so the patch reaches them).

A kernel working on CPU tensors runs in the interpreter (``in_interpreter``), which needs two things written apart
from the GPU's form, each behind a constexpr of the kernel:
- ``WHILE_LOOPS``: loops with device-read bounds. On the GPU they are ``for`` loops (only those get
  software-pipelined by ``num_stages``); in the triton 3.6 interpreter every scalar is a 1-element numpy array and
  ``range()`` calls ``int()`` on it, which numpy >= 2.4 rejects, while a ``while`` loop only needs ``bool()``.
- ``ROUND_BY_HAND``: float32 -> e4m3, which the interpreter converts wrongly in places (``quantization/fp8_tile.py``).
"""

from __future__ import annotations

import torch


def runs_kernel(t: torch.Tensor) -> bool:
    """The elementwise step on ``t`` runs its triton kernel (``fused_elementwise``)."""
    return t.is_cuda


def runs_moe_kernel(t: torch.Tensor) -> bool:
    """The routed experts on ``t`` run the fused MoE's triton kernel (``fused_moe_triton``; torch's experts on the
    CPU). DeepSeek's one-token shared slots exist only in that kernel, so the model asks this too."""
    return t.is_cuda


def in_interpreter(t: torch.Tensor) -> bool:
    """The triton kernel working on ``t`` runs in the interpreter (``t`` is not on a CUDA device: the CPU tests)."""
    return not t.is_cuda
