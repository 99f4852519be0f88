from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# wait_until_ready: every child's ready message, or a LaunchError as soon as one reports an error, dies
# (before or after its own code started) or does not report within the timeout. Real child processes
# (fork, for speed) stand in for the scheduler and the detokenizer.

import multiprocessing as mp
import os
import time

import pytest

from sglang.srt.entrypoints.startup_watch import LaunchError, StartingChild, wait_until_ready

CTX = mp.get_context("fork")


def ready(pipe, delay: float = 0.0) -> None:
    pipe.send({"status": "started"})
    time.sleep(delay)
    pipe.send({"status": "ready", "value": os.getpid()})
    time.sleep(5)  # a ready child keeps running


def reports_error(pipe) -> None:
    pipe.send({"status": "started"})
    pipe.send({"status": "error", "message": "Traceback ...\nValueError: bad weights"})


def dies_after_start(pipe) -> None:
    pipe.send({"status": "started"})
    os._exit(7)


def dies_before_start(pipe) -> None:
    os._exit(1)  # what a failed spawn bootstrap looks like from outside


def hangs(pipe) -> None:
    pipe.send({"status": "started"})
    time.sleep(60)


def start(target, name: str, *args) -> StartingChild:
    reader, writer = CTX.Pipe(duplex=False)
    p = CTX.Process(target=target, args=(writer, *args), name=name, daemon=True)
    p.start()
    writer.close()
    return StartingChild(p, reader)


def stop(children) -> None:
    for c in children:
        if c.process.is_alive():
            c.process.kill()
        c.process.join(5)


def test_all_ready():
    children = [start(ready, "a", 0.3), start(ready, "b")]
    try:
        infos = wait_until_ready(children, 10)
        assert [i["value"] for i in infos] == [c.process.pid for c in children]
    finally:
        stop(children)


@pytest.mark.parametrize(
    "target,words",
    [
        (reports_error, ["bad failed to start", "ValueError: bad weights"]),
        (dies_after_start, ["bad (pid", "exited with code 7 before it was ready"]),
        (dies_before_start, ["exited with code 1", 'if __name__ == "__main__":']),
    ],
)
def test_a_failing_child_is_reported_at_once(target, words):
    children = [start(ready, "good", 30), start(target, "bad")]  # the good one would take 30 s
    t = time.monotonic()
    try:
        with pytest.raises(LaunchError) as e:
            wait_until_ready(children, 60)
    finally:
        stop(children)
    assert time.monotonic() - t < 10
    for word in words:
        assert word in str(e.value), str(e.value)


def test_timeout_names_the_children_not_ready():
    children = [start(ready, "quick"), start(hangs, "slow")]
    try:
        with pytest.raises(LaunchError, match="slow did not report ready within 1 s"):
            wait_until_ready(children, 1)
    finally:
        stop(children)
