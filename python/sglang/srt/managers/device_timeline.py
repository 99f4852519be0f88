"""Where the device's time goes while the scheduler serves: prefill, decode, and the gaps between batches.

Every launched batch carries two marks, one just before its forward and one after its result copies
(`PendingResult`). On CUDA a mark is a timing event, so its time is the GPU's: the first mark of a batch
is reached when the GPU starts it (after the batch before it, if the host launched early), the second
when it ends. The time from one batch's end to the next one's start is a gap in which the device had
nothing queued: host work the overlap scheduler did not hide. Gaps after the scheduler ran out of work
(it waited for requests) are not counted: nobody asked for that time. On the CPU a forward runs
synchronously inside its launch, so the host's clock at the two marks is the device's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.managers.io_struct import SchedulerStats


@dataclass(frozen=True)
class DeviceMark:
    event: Optional[torch.cuda.Event]  # a timing event on the current stream (CUDA), else None
    host_time: float  # time.perf_counter() when marked

    @classmethod
    def now(cls, on_cuda: bool) -> "DeviceMark":
        event = None
        if on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return cls(event, time.perf_counter())

    def synchronize(self) -> None:
        if self.event is not None:
            self.event.synchronize()


def seconds_between(start: DeviceMark, end: DeviceMark) -> float:
    """Device seconds from `start` to `end`; both must have completed (CUDA: their events have run)."""
    if start.event is not None and end.event is not None:
        return start.event.elapsed_time(end.event) / 1000.0
    return end.host_time - start.host_time


class DeviceTimeline:
    """Adds each finished batch's device time, and the gap before it, to the scheduler's stats. Batches are
    accounted in launch order (the scheduler finishes them in that order)."""

    def __init__(self, stats: SchedulerStats) -> None:
        self.stats = stats
        self._last_end: Optional[DeviceMark] = None
        self._waited_for_work = True  # before the first batch: nothing to compare with

    def out_of_work(self) -> None:
        """The scheduler found nothing to run: the gap before the next batch is waiting, not a stall."""
        self._waited_for_work = True

    def account(self, is_prefill: bool, start: DeviceMark, end: DeviceMark) -> None:
        s = self.stats
        busy = seconds_between(start, end)
        gap = None
        if self._last_end is not None and not self._waited_for_work:
            gap = max(seconds_between(self._last_end, start), 0.0)
        if is_prefill:
            s.prefill_batches += 1
            s.prefill_device_seconds += busy
            if gap is not None:
                s.device_gap_before_prefill_seconds += gap
        else:
            s.decode_batches += 1
            s.decode_device_seconds += busy
            if gap is not None:
                s.device_gap_before_decode_seconds += gap
        self._last_end = end
        self._waited_for_work = False
