"""DeviceTimeline: a batch's device time and the idle gap before it, by batch kind; gaps after the scheduler ran
out of work are not stalls. CPU marks (host clock), set by hand so every sum is known."""

import time

import pytest

from sglang.srt.managers.device_timeline import DeviceMark, DeviceTimeline, seconds_between
from sglang.srt.managers.io_struct import SchedulerStats
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")


def mark(t: float) -> DeviceMark:
    return DeviceMark(event=None, host_time=t)


def test_busy_time_and_gaps_by_the_kind_that_follows():
    stats = SchedulerStats()
    timeline = DeviceTimeline(stats)
    timeline.account(True, mark(0.0), mark(1.0))  # first batch: no gap to measure
    timeline.account(True, mark(1.25), mark(2.0))  # 0.25 s idle before a prefill
    timeline.account(False, mark(2.5), mark(2.75))  # 0.5 s before a decode
    timeline.account(False, mark(2.75), mark(3.0))  # back to back
    assert (stats.prefill_batches, stats.decode_batches) == (2, 2)
    assert stats.prefill_device_seconds == pytest.approx(1.75)
    assert stats.decode_device_seconds == pytest.approx(0.5)
    assert stats.device_gap_before_prefill_seconds == pytest.approx(0.25)
    assert stats.device_gap_before_decode_seconds == pytest.approx(0.5)


def test_waiting_for_requests_is_not_a_gap():
    stats = SchedulerStats()
    timeline = DeviceTimeline(stats)
    timeline.account(False, mark(0.0), mark(1.0))
    timeline.out_of_work()
    timeline.account(True, mark(9.0), mark(10.0))  # 8 s without requests
    timeline.account(False, mark(10.5), mark(11.0))
    assert stats.device_gap_before_prefill_seconds == 0.0
    assert stats.device_gap_before_decode_seconds == pytest.approx(0.5)


def test_marks_use_the_host_clock_without_events():
    before = time.perf_counter()
    first = DeviceMark.now(on_cuda=False)
    time.sleep(0.01)
    second = DeviceMark.now(on_cuda=False)
    after = time.perf_counter()
    assert first.event is None and second.event is None
    assert before <= first.host_time < second.host_time <= after  # perf_counter, read at the mark
    assert 0.01 <= seconds_between(first, second) <= after - before
