"""How this process's CUDA context waits for the GPU (the driver's scheduling flags)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def yielding_sync(device_index: int) -> bool:
    """Make a thread that waits for the GPU (a synchronize, a blocking copy) yield its core while it waits,
    instead of spinning on it (CU_CTX_SCHED_YIELD on the device's primary context). Worth it when other
    threads of the process need every core meanwhile: the KT CPU experts compute while the scheduler waits.
    Returns whether the driver took the flag (it logs why not)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        logger.info("cuda-bindings is not installed: the CUDA context keeps its default (spinning) waits")
        return False
    (err,) = driver.cuInit(0)
    if err == driver.CUresult.CUDA_SUCCESS:
        err, device = driver.cuDeviceGet(device_index)
    if err == driver.CUresult.CUDA_SUCCESS:
        (err,) = driver.cuDevicePrimaryCtxSetFlags(device, driver.CUctx_flags.CU_CTX_SCHED_YIELD)
    if err != driver.CUresult.CUDA_SUCCESS:
        logger.warning("could not make CUDA waits yield (%s): the scheduler's thread spins while it waits", err)
        return False
    return True
