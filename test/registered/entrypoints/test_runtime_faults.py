"""Faults while serving end in a clear answer and the server keeps serving (or, for a dead child, the
Engine raises instead of blocking):
- a forward that runs out of device memory (injected: the N-th forward raises torch.OutOfMemoryError)
  answers that batch 503, counts it in sglang:num_oom_recoveries_total, frees its KV, and the next
  requests get their normal greedy output; a batch that hits a bug is answered 500 the same way;
- a frozen scheduler (SIGSTOP) turns /health to 503 within SGLANG_HEALTH_STALL_S, and a request
  waiting on it is answered 503 after SGLANG_REQUEST_TIMEOUT_S; SIGCONT brings both back;
- Engine.generate raises when the scheduler dies under it."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="per-commit-cpu")

import os
import re
import signal
import threading
import time

import pytest
import requests

from sglang.test.test_utils import kill_process_tree, popen_launch_server

TIMEOUT = 120
PARAMS = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def generate(base_url: str, text: str, **kw) -> requests.Response:
    return requests.post(f"{base_url}/generate", json={"text": text, "sampling_params": PARAMS, **kw}, timeout=TIMEOUT)


def metric(base_url: str, name: str) -> float:
    text = requests.get(f"{base_url}/metrics", timeout=TIMEOUT).text
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


# One server for both kinds of fault: the injected forward failures come first (they count forwards from the
# start), the frozen scheduler after. Its limits (a 2 s heartbeat stall, 12 s per request) do not touch the
# short requests of the first part.
SERVER_ENV = {
    "SGLANG_TEST_FAULT_INJECTION": "forward_oom=2,forward_error=10",
    "SGLANG_HEALTH_STALL_S": "2",
    "SGLANG_REQUEST_TIMEOUT_S": "12",
    "SGLANG_HEALTH_CHECK_TIMEOUT": "3",  # /health_generate gives up on a frozen scheduler after 3 s
}


def test_failed_batches_then_a_frozen_scheduler_are_answered_and_the_server_keeps_serving():
    proc = popen_launch_server(["--max-total-tokens", "4096"], env=SERVER_ENV)
    try:
        check_out_of_memory_and_failed_batches(proc)
        check_frozen_scheduler(proc.base_url)
    finally:
        kill_process_tree(proc.pid)


def check_out_of_memory_and_failed_batches(proc) -> None:
    # Forward 1 is the warm-up prefill, 2 the first request's prefill (OOM); the second request takes forwards
    # 3-8 (a prefill, then 5 decodes for 6 tokens); forward 10 is the third request's first decode (a bug).
    url = proc.base_url
    r = generate(url, "The capital of France is")
    assert r.status_code == 503, r.text
    assert "ran out of device memory" in r.json()["error"]["message"]
    good = generate(url, "The capital of France is")
    assert good.status_code == 200, good.text
    r = generate(url, "One two three")
    assert r.status_code == 500 and "internal error" in r.json()["error"]["message"], r.text
    again = generate(url, "The capital of France is")
    assert again.status_code == 200 and again.json()["output_ids"] == good.json()["output_ids"]
    assert metric(url, "sglang:num_oom_recoveries_total") == 1
    assert metric(url, "sglang:num_aborted_requests_total") >= 2
    assert requests.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    deadline = time.monotonic() + 10  # the scheduler reports its state every 0.5 s
    while requests.get(f"{url}/server_info", timeout=TIMEOUT).json()["scheduler_stats"]["num_used_tokens"]:
        assert time.monotonic() < deadline, "the failed batches' KV slots were not freed"
        time.sleep(0.2)
    log = open(proc.log_path).read()
    assert log.count("First out-of-memory error") == 1 and "Memory plan" in log


def check_frozen_scheduler(url: str) -> None:
    """SIGSTOP of the scheduler turns /health 503 within SGLANG_HEALTH_STALL_S and a request waiting on it is
    answered 503 after SGLANG_REQUEST_TIMEOUT_S; SIGCONT brings both back."""
    children = requests.get(f"{url}/server_info", timeout=TIMEOUT).json()["child_processes"]
    scheduler = next(c["pid"] for c in children if c["name"] == "sglang-scheduler-0")
    try:
        assert generate(url, "Warm").status_code == 200
        os.kill(scheduler, signal.SIGSTOP)
        stopped = time.monotonic()
        result = {}
        waiting = threading.Thread(target=lambda: result.update(r=generate(url, "Waiting for a frozen scheduler")))
        waiting.start()
        # Asked before the heartbeat stall shows (2 s), /health_generate waits SGLANG_HEALTH_CHECK_TIMEOUT (3 s)
        # for a token that never comes.
        probe = requests.get(f"{url}/health_generate", timeout=TIMEOUT)
        assert probe.status_code == 503 and "SGLANG_HEALTH_CHECK_TIMEOUT" in probe.json()["error"]["message"], (
            probe.text
        )
        while requests.get(f"{url}/health", timeout=TIMEOUT).status_code == 200:
            assert time.monotonic() - stopped < 10, "/health stayed 200 with a frozen scheduler"
            time.sleep(0.2)
        health = requests.get(f"{url}/health", timeout=TIMEOUT)
        assert health.status_code == 503 and "heartbeat" in health.json()["error"]["message"]
        waiting.join(30)
        r = result["r"]
        assert r.status_code == 503 and "SGLANG_REQUEST_TIMEOUT_S" in r.json()["error"]["message"], r.text
        assert time.monotonic() - stopped < 30
    finally:
        os.kill(scheduler, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while requests.get(f"{url}/health", timeout=TIMEOUT).status_code != 200:
        assert time.monotonic() < deadline, "/health did not recover after SIGCONT"
        time.sleep(0.2)
    assert generate(url, "Back again").status_code == 200


def test_engine_generate_raises_when_the_scheduler_dies():
    import sglang
    from sglang.srt.managers.tokenizer_manager import RequestError

    os.environ["SGLANG_TEST_FAULT_INJECTION"] = "scheduler_exit=3"  # read once, by the children at start-up
    try:
        engine = sglang.Engine(device="cpu", max_total_tokens=4096, log_level="error")
    finally:
        del os.environ["SGLANG_TEST_FAULT_INJECTION"]
    try:
        start = time.monotonic()
        with pytest.raises(RequestError) as e:
            engine.generate("Hello", {"max_new_tokens": 20, "ignore_eos": True})
        assert e.value.status_code == 503
        assert "sglang-scheduler-0" in e.value.message and "exited with code 3" in e.value.message
        assert time.monotonic() - start < 30
        with pytest.raises(RequestError, match="the engine died"):  # and so does every later call, at once
            engine.generate("Again", {"max_new_tokens": 2})
    finally:
        engine.shutdown()
