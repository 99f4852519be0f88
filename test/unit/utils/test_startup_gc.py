"""The garbage collector around a process's start-up: off while the modules are imported (launch_server.main in
the launcher, ChildEntry in every spawned child), then the imports frozen and the collector on for the rest of
start-up; at its end, start-up's garbage collected and the survivors frozen."""

import gc
import multiprocessing as mp
import pickle
import weakref

import pytest

from sglang.srt.utils.process import (
    STARTUP_READY,
    STARTUP_STARTED,
    ChildEntry,
    freeze_imports,
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
def restore_collector():
    """The test process gets its collector back as it was: on, nothing frozen."""
    yield
    gc.unfreeze()
    gc.enable()


def test_freeze_collects_startup_garbage_then_freezes(restore_collector):
    gc.disable()  # so that only freeze_startup_objects can free the cycle
    garbage = _Cycle()
    gone = weakref.ref(garbage)
    survivor = _Cycle()
    del garbage
    assert gone() is not None
    freeze_startup_objects()
    assert gone() is None, "start-up's cyclic garbage must be collected before the freeze"
    assert survivor.me is survivor and gc.get_freeze_count() > 0  # the survivors sit in the permanent generation


def test_freezing_the_imports_turns_the_collector_on(restore_collector):
    gc.disable()
    freeze_imports()
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_a_successful_startup_ends_frozen(restore_collector):
    pipe = _Pipe()
    with reporting_startup(pipe, "Test child"):
        pipe.send({"status": STARTUP_READY})
    assert [m["status"] for m in pipe.sent] == [STARTUP_STARTED, STARTUP_READY]
    assert gc.get_freeze_count() > 0


def report_collector_state(queue) -> None:
    queue.put(gc.isenabled())


def test_a_spawned_child_imports_with_the_collector_off_and_starts_with_it_on(restore_collector):
    """Unpickling the entry (before the arguments and the target's imports) turns it off, in the child alone;
    calling it turns it on before the target runs."""
    entry = ChildEntry.of(report_collector_state)
    assert entry == ChildEntry(__name__, "report_collector_state")
    assert pickle.loads(pickle.dumps(entry)) == entry and not gc.isenabled()
    got = []

    class Queue:
        put = got.append

    entry(Queue())
    assert got == [True]

    gc.unfreeze()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=entry, args=(queue,), daemon=True)
    child.start()
    try:
        assert queue.get(timeout=60) is True
    finally:
        child.join(30)
    assert child.exitcode == 0 and gc.isenabled()


def test_the_launcher_imports_and_resolves_with_the_collector_off(monkeypatch, restore_collector):
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
