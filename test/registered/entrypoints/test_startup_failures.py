"""A child that dies or hangs during start-up is noticed within seconds: the launcher exits non-zero
naming the child and how it ended (the Engine raises), and no process is left behind. Covers the
scheduler and the detokenizer dying before ready (injected), a real SIGKILL of the scheduler while
it loads the model, a child that never reports ready (SGLANG_STARTUP_TIMEOUT), and a script that
creates an Engine without the `if __name__ == "__main__":` guard (the spawn re-import)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=80, suite="per-commit-cpu")

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from sglang.test.test_utils import (
    descendant_pids,
    find_free_port,
    kill_process_tree,
    pids_with_env,
    server_env,
    wait_pids_gone,
)

SERVER_ARGS = ["--max-total-tokens", "4096"]
NOTICE_S = 15  # a dead child must be reported this soon (the model loads in ~10 s on 2 cores)


MARKER = "SGLANG_TEST_LAUNCH_ID"  # every process of one launch carries it: orphans can be found afterwards


def launch(env: dict) -> subprocess.Popen:
    args = [sys.executable, "-m", "sglang.launch_server", *SERVER_ARGS, "--port", str(find_free_port())]
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env({**env, MARKER: marker})
    )
    proc.marker = marker  # type: ignore[attr-defined]
    return proc


def orphans(proc: subprocess.Popen) -> list:
    return wait_pids_gone(pids_with_env(MARKER, proc.marker), 5)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_tree(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f"the launcher was still running after {timeout:.0f} s:\n{out[-3000:]}")
    return out


@pytest.mark.parametrize("who,name", [("scheduler", "sglang-scheduler-0"), ("detokenizer", "sglang-detokenizer")])
def test_child_dying_before_ready_fails_the_launch(who, name):
    proc = launch({"SGLANG_TEST_FAULT_INJECTION": f"startup_exit={who}"})
    out = finish(proc, 120)
    assert proc.returncode != 0
    assert "Server start-up failed" in out, out[-3000:]
    assert f"{name} (pid" in out and "exited with code 3 before it was ready" in out, out[-3000:]
    assert orphans(proc) == []


def test_startup_timeout_names_the_child_that_hangs():
    # A short timeout: a scheduler still loading when it expires is named too ("sglang-scheduler-0,
    # sglang-detokenizer did not report ..."), and the hanging child is named either way.
    start = time.monotonic()
    # 6 s: the scheduler is usually still loading the model then, so the test does not pay for a whole start.
    proc = launch({"SGLANG_TEST_FAULT_INJECTION": "startup_hang=detokenizer", "SGLANG_STARTUP_TIMEOUT": "6"})
    out = finish(proc, 120)
    assert proc.returncode != 0
    assert "sglang-detokenizer did not report ready within 6 s (SGLANG_STARTUP_TIMEOUT)" in out, out[-3000:]
    assert time.monotonic() - start < 6 + 30
    assert orphans(proc) == []


def test_scheduler_killed_while_loading_is_noticed_at_once():
    proc = launch({})
    try:
        deadline = time.monotonic() + 60
        while True:  # the scheduler is the first child multiprocessing spawns (the lowest pid of them)
            spawned = [p for p in descendant_pids(proc.pid) if b"spawn_main" in open(f"/proc/{p}/cmdline", "rb").read()]
            if len(spawned) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(spawned) >= 2, "the scheduler and detokenizer never started"
        os.kill(min(spawned), signal.SIGKILL)
        killed = time.monotonic()
        out = finish(proc, 60)
        took = time.monotonic() - killed
    finally:
        kill_process_tree(proc.pid)
    assert proc.returncode != 0
    assert "sglang-scheduler-0" in out and "exited with code -9 (SIGKILL) before it was ready" in out, out[-3000:]
    assert took < NOTICE_S, f"the launcher took {took:.1f} s to notice"
    assert wait_pids_gone(spawned, 5) == [] and orphans(proc) == []


def test_engine_without_main_guard_explains_the_fix(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(
        textwrap.dedent("""
        import sglang
        engine = sglang.Engine(device="cpu", max_total_tokens=4096, log_level="error")
        print(engine.generate("Hi", {"max_new_tokens": 2}))
    """)
    )
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=server_env({MARKER: marker}),
        cwd=tmp_path,
    )
    proc.marker = marker  # type: ignore[attr-defined]
    out = finish(proc, 120)
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in out and str(script) in out, out[-3000:]
    assert orphans(proc) == []
