"""The garbage collector around a process's start-up: off while it runs (launch_server.py, in the launcher and in
every spawned child), then start-up's garbage collected, the survivors frozen and the collector back on."""

import gc
import subprocess
import sys
import weakref

import pytest

from sglang.srt.utils.process import STARTUP_READY, STARTUP_STARTED, freeze_startup_objects, reporting_startup
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")


class _Cycle:
    def __init__(self) -> None:
        self.me = self


class _Pipe:
    def __init__(self) -> None:
        self.sent = []

    def send(self, msg) -> None:
        self.sent.append(msg)


@pytest.fixture
def collector_off():
    """The state launch_server.py leaves a process in; the test process gets its collector back afterwards."""
    gc.disable()
    yield
    gc.unfreeze()
    gc.enable()


def test_freeze_collects_startup_garbage_then_freezes_and_reenables(collector_off):
    garbage = _Cycle()
    gone = weakref.ref(garbage)
    survivor = _Cycle()
    del garbage
    assert gone() is not None  # a cycle: only the collector frees it, and it is off
    freeze_startup_objects()
    assert gone() is None, "start-up's cyclic garbage must be collected before the freeze"
    assert gc.isenabled()
    assert survivor.me is survivor and gc.get_freeze_count() > 0  # the survivors sit in the permanent generation


def test_a_successful_startup_ends_with_the_collector_on_and_frozen(collector_off):
    pipe = _Pipe()
    with reporting_startup(pipe, "Test child"):
        pipe.send({"status": STARTUP_READY})
    assert [m["status"] for m in pipe.sent] == [STARTUP_STARTED, STARTUP_READY]
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_importing_the_launcher_turns_the_collector_off():
    """What each spawned child of `python -m sglang.launch_server` runs first (its main module)."""
    code = "import gc; assert gc.isenabled(); import sglang.launch_server; print(gc.isenabled())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
