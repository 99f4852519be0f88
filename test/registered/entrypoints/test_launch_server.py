"""`python -m sglang.launch_server` as a process: bad flags fail fast, /health comes up in time, and
every way of stopping (SIGTERM, a crashed scheduler) leaves no child process behind.

Start-up promise checked here: /health answers within STARTUP_BUDGET_S on 2 CPU cores (measured
~20-30 s for the built-in SmolLM2 on an idle machine)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=105, suite="per-commit-cpu")

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
    wait_for_log,
    wait_pids_gone,
)

STARTUP_BUDGET_S = 120
SERVER_ARGS = ["--max-total-tokens", "16384"]


def run_launcher(args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=server_env(),
    )


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--page-size", "-1"),
        ("--load-format", "foo"),
        ("--model-path", "/nonexistent/model"),
        ("--chat-template", "/nonexistent.jinja"),
    ],
)
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


def child_pid(base_url: str, name: str) -> int:
    children = requests.get(f"{base_url}/server_info", timeout=10).json()["child_processes"]
    return next(c["pid"] for c in children if c["name"] == name)


def wait_running(base_url: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while requests.get(f"{base_url}/server_info", timeout=10).json()["scheduler_stats"]["num_running_reqs"] < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests ever ran"
        time.sleep(0.1)


@pytest.mark.parametrize("name", ["sglang-scheduler-0", "sglang-detokenizer"])
def test_child_death_answers_503_naming_it_and_exits_nonzero(name):
    """SIGKILL of a child while requests run: /health is 503 at once, in-flight and new requests get a
    503 that names the child and how it died, streams end with an error event, the launcher exits 1."""
    proc = popen_launch_server(SERVER_ARGS, timeout=STARTUP_BUDGET_S)
    try:
        kids = children_of(proc.pid)
        victim = child_pid(proc.base_url, name)
        results = {}
        body = {"text": "Count slowly", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}

        def plain():
            r = requests.post(f"{proc.base_url}/generate", timeout=60, json=body)
            results["plain"] = (r.status_code, r.json())

        def streamed():
            r = requests.post(f"{proc.base_url}/generate", timeout=60, json={**body, "stream": True}, stream=True)
            results["stream"] = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]

        clients = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for t in clients:
            t.start()
        wait_running(proc.base_url, 2)
        os.kill(victim, signal.SIGKILL)
        killed, health = time.monotonic(), 200
        while health == 200 and time.monotonic() - killed < 5:  # until the kernel has reaped the child
            try:  # the launcher stops serving within moments; until then /health must say 503
                health = requests.get(f"{proc.base_url}/health", timeout=10).status_code
            except requests.ConnectionError:
                health = None
        noticed = time.monotonic() - killed
        for t in clients:
            t.join(30)
        status, err = results["plain"]
        assert health in (503, None) and noticed < 0.5, (health, noticed)
        assert status == 503, err
        message = err["error"]["message"]
        assert name in message and "SIGKILL" in message and "the engine died" in message, message
        events = results["stream"]
        assert events[-1] == "data: [DONE]" and "the engine died" in events[-2], events[-3:]
        assert proc.wait(timeout=30) == 1
        assert wait_pids_gone(kids, 5) == [], "child processes survived the launcher"
    finally:
        kill_process_tree(proc.pid)


def test_startup_then_sigterm_under_load_answers_everyone_and_exits_zero(tmp_path):
    """/health comes up within the start-up budget and the log has the memory plan; then SIGTERM (the default
    grace period) with requests in flight: short ones finish, long ones get a JSON 503 (streams an error
    event), nothing new is accepted, the launcher exits 0 within the grace period, no child process is left
    behind, no tracebacks."""
    from sglang.srt.environ import envs

    grace = envs.SGLANG_SHUTDOWN_GRACE_S.get()  # the default unless the caller's environment sets it
    start = time.monotonic()
    profile = tmp_path / "http_profile.txt"  # SGLANG_PROFILE_HTTP_SERVER: written when the server stops
    proc = popen_launch_server(SERVER_ARGS, timeout=STARTUP_BUDGET_S, env={"SGLANG_PROFILE_HTTP_SERVER": str(profile)})
    try:
        startup = time.monotonic() - start
        print(f"/health answered {startup:.1f} s after launch")
        assert startup < STARTUP_BUDGET_S
        log = wait_for_log(proc, "The server is fired up and ready to roll!", 10)  # logged just after /health's 200
        assert "Memory plan" in log
        assert proc.base_url in log
        kids = children_of(proc.pid)
        results = {}

        def plain(key, tokens):
            body = {"text": f"Request {key}", "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
            r = requests.post(f"{proc.base_url}/generate", timeout=60, json=body)
            results[key] = (r.status_code, r.json())

        def streamed(key):
            body = {"text": "Stream", "stream": True, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
            r = requests.post(f"{proc.base_url}/generate", timeout=60, json=body, stream=True)
            results[key] = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]

        clients = [threading.Thread(target=plain, args=(f"long{i}", 4000)) for i in range(3)]
        clients.append(threading.Thread(target=streamed, args=("stream",)))
        for t in clients:
            t.start()
        wait_running(proc.base_url, 4)
        short = threading.Thread(target=plain, args=("short", 4))
        short.start()
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        time.sleep(0.5)
        with pytest.raises(requests.ConnectionError):  # the listening socket is closed
            requests.get(f"{proc.base_url}/health", timeout=5)
        for t in clients + [short]:
            t.join(30)
        assert proc.wait(timeout=grace + 15) == 0, read_log(proc)[-3000:]
        took = time.monotonic() - stopped
        assert results["short"][0] == 200, results["short"]
        for i in range(3):
            status, err = results[f"long{i}"]
            assert status == 503 and "shutting down" in err["error"]["message"], (status, err)
        events = results["stream"]
        assert events[-1] == "data: [DONE]" and "shutting down" in events[-2], events[-3:]
        assert took < grace + 10, f"took {took:.1f} s to stop"
        assert wait_pids_gone(kids, 5) == [], "child processes survived the launcher"
        log = read_log(proc)
        assert "Traceback" not in log, log[-3000:]
        assert "Ordered by: cumulative time" in profile.read_text()  # the profile was written at the stop
    finally:
        kill_process_tree(proc.pid)


def test_second_sigterm_stops_at_once():
    """With a long grace period, a second SIGTERM does not wait for it: requests get their 503 and the
    launcher exits within seconds."""
    proc = popen_launch_server(SERVER_ARGS, timeout=STARTUP_BUDGET_S, env={"SGLANG_SHUTDOWN_GRACE_S": "60"})
    try:
        result = {}

        def long_request():
            body = {"text": "Count", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
            r = requests.post(f"{proc.base_url}/generate", timeout=60, json=body)
            result["r"] = (r.status_code, r.json())

        client = threading.Thread(target=long_request)
        client.start()
        wait_running(proc.base_url, 1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert proc.wait(timeout=20) == 0
        client.join(10)
        assert time.monotonic() - stopped < 10
        status, err = result["r"]
        assert status == 503 and "shutting down" in err["error"]["message"], result
    finally:
        kill_process_tree(proc.pid)


def test_sglang_launch_flags_log_requests_skip_warmup_metrics_dp():
    """Flags SGLang's launch lines carry: --log-requests logs each request's arrival and end (ids, sizes,
    parameters, never its text), --skip-server-warmup announces readiness with no generation run, --enable-metrics
    (always served) and --dp 1 are accepted; --dp 2 is refused by name."""
    result = run_launcher(["--port", "1", "--dp", "2"])
    assert result.returncode == 2 and "--dp-size 2" in result.stderr and "sglang-router" in result.stderr
    args = [*SERVER_ARGS, "--log-requests", "--skip-server-warmup", "--enable-metrics", "--dp", "1"]
    proc = popen_launch_server(args, timeout=STARTUP_BUDGET_S)
    try:
        wait_for_log(proc, "fired up and ready to roll", 30)

        def generated() -> int:
            info = requests.get(f"{proc.base_url}/server_info", timeout=10).json()
            return info["scheduler_stats"]["generation_tokens_total"]

        time.sleep(1.5)  # the scheduler's stats are sent every 0.5 s
        assert generated() == 0  # no warm-up generation ran
        secret = "A prompt the log must not show"
        body = {"text": secret, "rid": "logged-1", "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
        assert requests.post(f"{proc.base_url}/generate", json=body, timeout=60).status_code == 200
        log = wait_for_log(proc, "Finish: rid=logged-1", 10)
        assert "Receive: rid=logged-1 prompt_tokens=" in log and "'max_new_tokens': 3" in log
        assert "completion_tokens=3" in log and secret not in log
        deadline = time.monotonic() + 10
        while generated() < 3:  # the counter read above is live
            assert time.monotonic() < deadline, "the scheduler's generated-token count never reached 3"
            time.sleep(0.25)
        assert requests.get(f"{proc.base_url}/metrics", timeout=10).status_code == 200
    finally:
        kill_process_tree(proc.pid)
