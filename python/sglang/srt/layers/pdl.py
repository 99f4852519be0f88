"""Programmatic dependent launch (PDL, Hopper and later): the decode step's kernels overlap their launch.

A kernel launched with PDL (triton's ``launch_pdl=True``) may start while the kernel ahead of it in the
stream still runs, once every program of that kernel has released it (``griddepcontrol.launch_dependents``).
Before it reads that kernel's output, or writes memory that kernel may still read, it must wait
(``griddepcontrol.wait``: the kernel before has finished and its writes are visible). Waiting at the top
keeps stream order exactly; what is gained is the launch and ramp-up of each kernel, which otherwise
starts only after the one before has drained (a few microseconds per kernel, ~10 kernels per layer).

Our triton kernels on the decode path release at their top and, when launched with PDL, wait right after
(``pdl_prologue``). The skinny decode GEMM does better: its weights are never written during a forward, so
it streams its first weight tile, and has L2 fetch the front of its weight rows, before it waits
(``decode_gemm/kernel.py``). A kernel launched without
PDL (torch's, cuBLAS's) waits for the whole kernel before it, as always.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=None)
def _device_supports_pdl(device_index: int) -> bool:
    """Compute capability 9.0+ (a fact of the device: asked once per device, not before every launch)."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_available(t: torch.Tensor) -> bool:
    """Launch kernels working on ``t`` with PDL: a CUDA tensor on compute capability 9.0+."""
    if not t.is_cuda:
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _device_supports_pdl(index)


@triton.jit
def release_dependents(ENABLED: tl.constexpr):
    if ENABLED:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_prerequisites(ENABLED: tl.constexpr):
    if ENABLED:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_prologue(ENABLED: tl.constexpr):
    """First statement of a kernel launched with ``launch_pdl=ENABLED``: let the next kernel launch, then
    wait for the one before. The release takes effect once every program has run it, so the next kernel's
    programs never take the place of this kernel's own later waves."""
    release_dependents(ENABLED)
    wait_for_prerequisites(ENABLED)
