"""Math for the project's triton kernels that triton's language lacks in a form both the GPU and the interpreter (the
CPU tests) run: libdevice's functions are GPU-only, so each function here calls libdevice when compiled for the GPU
and a formula of triton's own ops when interpreted."""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs
from triton.language.extra import libdevice  # the backend's libdevice (CUDA's) when compiled

# Whether triton.jit interprets this process's kernels: the condition it reads (TRITON_INTERPRET) when it wraps a
# function, so read once at import as the kernels are wrapped; a constexpr, so the branch on it is pruned at compile.
INTERPRETED = tl.constexpr(knobs.runtime.interpret)


@triton.jit
def tanh(x):
    """tanh in fp32. On the GPU libdevice's (__nv_tanhf, the CUDA math library's precise tanhf, which torch's CUDA
    kernels such as gelu(approximate="tanh") call): the same bits as torch. The interpreter cannot run libdevice, so
    there 1 - 2 / (exp(2x) + 1), which may differ in the last bit and saturates cleanly to +-1 (exp overflows to inf,
    giving 1)."""
    if INTERPRETED:
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
    else:
        return libdevice.tanh(x)
