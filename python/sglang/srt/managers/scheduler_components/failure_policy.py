"""What the scheduler does when one batch fails: answer its requests, free their KV, keep serving.

A forward can fail without the engine being broken: CUDA runs out of memory because a neighbour
process took it (the caching allocator and the KV pool are intact; the memory comes back), or one
batch trips over a bug. Dying would drop every other user's request and take the server down for
good. Instead the requests of that batch are finished with an error the client can read (HTTP 503
for out-of-memory: retry later; 500 for a bug), the KV slots the batch had just allocated are freed
without entering the radix cache (their contents are half-written), and the next step runs.

With tensor parallelism a failure on one rank leaves the other ranks inside a collective that will
never complete, so there it stays fatal (a clear message and a clean exit, never a hang).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import torch

from sglang.srt.managers.io_struct import SchedulerStats
from sglang.srt.managers.schedule_batch import FinishReason

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler_components.batch_result import LaunchedBatch

logger = logging.getLogger(__name__)

OOM_STATUS = 503  # the request was fine; the device was not: retry later
ERROR_STATUS = 500


def is_device_oom(exc: BaseException) -> bool:
    """CUDA (or CPU allocator) out of memory, however the library reported it."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("CUBLAS_STATUS_ALLOC_FAILED" in text or "out of memory" in text.lower())


def is_device_fault(exc: BaseException) -> bool:
    """A CUDA error other than out-of-memory: it poisons the context, so every later step would fail too."""
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8 raises this for CUDA errors
    return (accelerator_error is not None and isinstance(exc, accelerator_error)) or "CUDA error" in str(exc)


class BatchFailurePolicy:
    """What a failed batch's requests are told (or that the server must stop); the scheduler then frees
    their KV and answers them (Scheduler.fail_batch)."""

    def __init__(
        self, tp_size: int, tp_rank: int, device: str, stats: SchedulerStats, memory_plan_table: Callable[[], str]
    ) -> None:
        self.tp_size, self.tp_rank, self.device, self.stats = tp_size, tp_rank, device, stats
        self.memory_plan_table = memory_plan_table  # logged with the first out-of-memory error
        self._oom_logged = False

    def finish_reason(self, batch: "LaunchedBatch", exc: Exception) -> FinishReason:
        """The abort every request of `batch` gets; raises when the server cannot go on."""
        oom = is_device_oom(exc)
        if not oom and is_device_fault(exc):
            raise exc  # the CUDA context is broken (e.g. an illegal memory access): nothing can run after it
        what = "prefill" if batch.forward_mode.is_extend() else "decode"
        tokens = sum(batch.extend_lens) if batch.forward_mode.is_extend() else batch.batch_size()
        if self.tp_size > 1:
            raise RuntimeError(
                f"{'out of device memory' if oom else 'error'} in a {what} batch on tensor-parallel rank "
                f"{self.tp_rank}; the other ranks cannot continue in step, so the server stops: {exc}"
            ) from exc
        if not oom:
            logger.exception(
                "A %s batch of %d request(s) failed; they are aborted, the server keeps serving",
                what,
                batch.batch_size(),
            )
            message = f"internal error while running this request's batch: {type(exc).__name__}: {exc}"
            return FinishReason("abort", message=message, status_code=ERROR_STATUS)
        self.stats.num_oom_recoveries += 1
        self._log_oom_once(exc)
        if self.device == "cuda":
            torch.cuda.empty_cache()  # give back what the failed step had cached
        logger.error(
            "Out of device memory in a %s batch of %d request(s): aborted them (%s)", what, batch.batch_size(), exc
        )
        message = (
            f"the server ran out of device memory while running this request's {what} batch "
            f"({batch.batch_size()} request(s), {tokens} token(s)); the batch was aborted and the server keeps "
            "serving: retry later, or start it with a lower --mem-fraction-static, --chunked-prefill-size or "
            "--max-running-requests"
        )
        return FinishReason("abort", message=message, status_code=OOM_STATUS)

    def _log_oom_once(self, exc: BaseException) -> None:
        if self._oom_logged:
            return
        self._oom_logged = True
        summary = torch.cuda.memory_summary(abbreviated=True) if self.device == "cuda" else "(not a CUDA device)"
        logger.error("First out-of-memory error (%s). %s\n%s", exc, self.memory_plan_table(), summary)
