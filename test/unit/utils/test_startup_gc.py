"""The garbage collector around a process's start-up: off while it runs (launch_server.main in the launcher,
ChildEntry in every spawned child), then start-up's garbage collected, the survivors frozen and the collector back
on."""

import gc
import multiprocessing as mp
import pickle
import weakref

import pytest

from sglang.srt.utils.process import (
    STARTUP_READY,
    STARTUP_STARTED,
    ChildEntry,
    freeze_startup_objects,
    reporting_startup,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import find_free_port

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


@pytest.fixture
def collector_on_after():
    yield
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


def report_collector_state(queue) -> None:
    queue.put(gc.isenabled())


def test_a_spawned_child_starts_with_the_collector_off():
    """Unpickling the entry (before the arguments and the target's imports) turns it off in the child alone."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=ChildEntry.of(report_collector_state), args=(queue,), daemon=True)
    child.start()
    try:
        assert queue.get(timeout=60) is False
    finally:
        child.join(30)
    assert gc.isenabled(), "the parent's collector must stay on"
    assert child.exitcode == 0


def test_the_entry_calls_its_function_and_unpickling_it_turns_the_collector_off(collector_on_after):
    entry = ChildEntry.of(report_collector_state)
    assert entry == ChildEntry(__name__, "report_collector_state")
    assert pickle.loads(pickle.dumps(entry)) == entry and not gc.isenabled()
    gc.enable()
    got = []

    class Queue:
        put = got.append

    entry(Queue())
    assert got == [gc.isenabled()]


def test_the_launcher_runs_start_up_with_the_collector_off_and_turns_it_on_when_it_returns(monkeypatch):
    import sglang.launch_server
    from sglang.srt.configs import engine_config

    seen = []

    def resolve(args, parser):
        seen.append(gc.isenabled())
        raise SystemExit(3)

    monkeypatch.setattr(engine_config, "resolve_or_exit", resolve)
    with pytest.raises(SystemExit):
        sglang.launch_server.main(["--device", "cpu", "--port", str(find_free_port())])
    assert seen == [False] and gc.isenabled()
