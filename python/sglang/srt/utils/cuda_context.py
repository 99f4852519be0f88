"""How this process's CUDA context waits for the GPU (the driver's scheduling flags)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

HOST_WAIT_FLAGS = {  # set_host_wait mode -> the CUctx_flags member
    "block": "CU_CTX_SCHED_BLOCKING_SYNC",
    "yield": "CU_CTX_SCHED_YIELD",
    "spin": "CU_CTX_SCHED_SPIN",
}


def set_host_wait(device_index: int, mode: str) -> bool:
    """Choose how a thread that waits for the GPU (a synchronize, a blocking copy) spends the wait: `block`
    sleeps until the GPU signals (its core is free for other threads; waking takes some microseconds),
    `yield` polls and yields its core between polls, `spin` polls. The KT CPU experts compute on every
    core while the scheduler waits, so they want it to block or yield. Sets the flag on the device's primary
    context (before it is created); returns whether the driver took it (it logs why not)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        logger.info("cuda-bindings is not installed: the CUDA context keeps its default (spinning) waits")
        return False
    (err,) = driver.cuInit(0)
    if err == driver.CUresult.CUDA_SUCCESS:
        err, device = driver.cuDeviceGet(device_index)
    if err == driver.CUresult.CUDA_SUCCESS:
        (err,) = driver.cuDevicePrimaryCtxSetFlags(device, getattr(driver.CUctx_flags, HOST_WAIT_FLAGS[mode]))
    if err != driver.CUresult.CUDA_SUCCESS:
        logger.warning("could not set the CUDA context's waits to %s (%s): they keep the default", mode, err)
        return False
    return True
