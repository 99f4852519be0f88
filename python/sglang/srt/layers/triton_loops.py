"""Which loop form a triton kernel with device-read loop bounds should compile to.

Such loops are written twice in our kernels, selected by a ``WHILE_LOOPS`` constexpr. On the GPU they are
``for`` loops (only those get software-pipelined by ``num_stages``). In the triton 3.6 interpreter (the CPU
tests) every scalar is a 1-element numpy array and ``range()`` calls ``int()`` on it, which numpy >= 2.4
rejects; a ``while`` loop only needs ``bool()``.
"""

from __future__ import annotations

import torch


def use_while_loops(t: torch.Tensor) -> bool:
    """True where the kernel working on ``t`` runs in the interpreter (``t`` is not on a CUDA device)."""
    return not t.is_cuda
