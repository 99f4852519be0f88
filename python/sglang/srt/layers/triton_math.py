"""Math for the project's triton kernels that triton's language lacks in a form both the GPU and the interpreter (the
CPU tests) run: libdevice's functions are GPU-only."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    """tanh in fp32 as 1 - 2 / (exp(2x) + 1): saturates cleanly to +-1 (exp overflows to inf, giving 1)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
