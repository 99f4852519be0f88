"""`python -m sglang.launch_server` as a process: bad flags fail fast, /health comes up in time, and
every way of stopping (SIGTERM, a crashed scheduler) leaves no child process behind.

Start-up promise checked here: /health answers within STARTUP_BUDGET_S on 2 CPU cores (measured
~20-30 s for the built-in SmolLM2 on an idle machine)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=55, suite="per-commit-cpu")

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from sglang.test.test_utils import (
    descendant_pids,
    kill_process_tree,
    popen_launch_server,
    read_log,
    server_env,
    wait_pids_gone,
)

STARTUP_BUDGET_S = 120
SERVER_ARGS = ["--max-total-tokens", "16384"]


def run_launcher(args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args], capture_output=True, text=True,
                          timeout=timeout, env=server_env())


@pytest.mark.parametrize("flag,value", [("--page-size", "-1"), ("--load-format", "foo"),
                                        ("--model-path", "/nonexistent/model"), ("--chat-template", "/nonexistent.jinja")])
def test_bad_flag_exits_fast_naming_it(flag, value):
    start = time.monotonic()
    result = run_launcher(["--port", "1", flag, value])  # port 1 is never bound: parsing must fail first
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert flag in result.stderr, output[-2000:]
    assert "Load weight" not in output  # no model was loaded
    assert elapsed < 30, f"took {elapsed:.1f} s to reject {flag}"


def test_busy_port_fails_before_loading_the_model():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_launcher(["--port", str(port)])
    assert result.returncode != 0
    assert "--port" in result.stderr and "Load weight" not in result.stderr, result.stderr[-2000:]


def children_of(pid: int):
    """The launcher's descendants: the scheduler, the detokenizer, multiprocessing's resource tracker."""
    kids = descendant_pids(pid)
    assert len(kids) >= 2, f"expected the scheduler and detokenizer processes, found {kids}"
    return kids


def test_startup_time_and_sigterm_leaves_no_orphans():
    start = time.monotonic()
    proc = popen_launch_server(SERVER_ARGS, timeout=STARTUP_BUDGET_S)
    try:
        startup = time.monotonic() - start
        print(f"/health answered {startup:.1f} s after launch")
        assert startup < STARTUP_BUDGET_S
        log = read_log(proc)
        assert "Memory plan" in log and "The server is fired up and ready to roll!" in log
        assert proc.base_url in log
        kids = children_of(proc.pid)
        # A streaming request in flight must not keep the server from stopping.
        stream = requests.post(f"{proc.base_url}/generate", stream=True, timeout=60, json={
            "text": "Count slowly", "stream": True, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}})
        lines = stream.iter_lines()  # keep the iterator: dropping it would close the connection
        assert next(lines).startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, read_log(proc)[-3000:]
        assert wait_pids_gone(kids, 5) == [], "child processes survived the launcher"
    finally:
        kill_process_tree(proc.pid)


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


def test_scheduler_crash_fails_requests_and_exits_nonzero():
    proc = popen_launch_server(SERVER_ARGS, timeout=STARTUP_BUDGET_S)
    try:
        kids = children_of(proc.pid)
        scheduler = max(kids, key=_rss_kb)  # it holds the weights and the KV pool: by far the largest
        result = {}

        def long_request():
            r = requests.post(f"{proc.base_url}/generate", timeout=60, json={
                "text": "Count slowly", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}})
            result["status"], result["body"] = r.status_code, r.json()

        client = threading.Thread(target=long_request)
        client.start()
        deadline = time.monotonic() + 30
        while requests.get(f"{proc.base_url}/server_info", timeout=10).json()["scheduler_stats"]["num_running_reqs"] < 1:
            assert time.monotonic() < deadline, "the request never started running"
            time.sleep(0.2)
        os.kill(scheduler, signal.SIGKILL)
        client.join(30)
        assert result.get("status") == 500, result
        assert "error" in result["body"] and result["body"]["error"]["message"]
        assert proc.wait(timeout=30) != 0
        assert wait_pids_gone(kids, 5) == [], "child processes survived the launcher"
        assert "Shutting down" in read_log(proc)
    finally:
        kill_process_tree(proc.pid)
