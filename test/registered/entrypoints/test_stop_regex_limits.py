"""A stop_regex that backtracks catastrophically fails its own request with a 400 naming stop_regex, promptly,
on every route that takes the field, while a concurrent normal request completes unchanged, and the server stays
healthy (nothing left running or holding KV). Before the time budget (sampling/stop_regex.py) the scheduler froze
in the match and every user hung until a restart.

Uses the shared SmolLM2 server (conftest.py). logit_bias forces token 28909 (64 "=" characters), on which
"(=|==)+[^=]" tries every split of the run into "=" and "==" before failing."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Tuple

import pytest
import requests

TIMEOUT = 120  # a client-side guard: a frozen scheduler fails the test instead of hanging it
PROMPT_BOUND_S = 30.0  # generous for a loaded 2-core CPU; a frozen scheduler never answers
PATHOLOGICAL = "(=|==)+[^=]"
FORCE_EQUALS = {"28909": 100}
BAD_SAMPLING = {"max_new_tokens": 4, "temperature": 0, "logit_bias": FORCE_EQUALS, "stop_regex": PATHOLOGICAL}
GOOD = {
    "text": "Write one sentence about the sea.",
    "sampling_params": {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True},
}
BAD_REQUESTS = {
    "generate": ("/generate", {"text": "x", "sampling_params": BAD_SAMPLING}),
    "generate_stream": ("/generate", {"text": "x", "sampling_params": BAD_SAMPLING, "stream": True}),
    "completions": (
        "/v1/completions",
        {"prompt": "x", "max_tokens": 4, "temperature": 0, "logit_bias": FORCE_EQUALS, "stop_regex": PATHOLOGICAL},
    ),
    "chat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "temperature": 0,
            "logit_bias": FORCE_EQUALS,
            "stop_regex": PATHOLOGICAL,
        },
    ),
}


@pytest.fixture(scope="module")
def base_url(smollm2_server):
    return smollm2_server.base_url


def good_text(base_url: str) -> str:
    r = requests.post(f"{base_url}/generate", json=GOOD, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 48, r.json()
    return r.json()["text"]


def send_bad(base_url: str, name: str) -> Tuple[float, int, str]:
    """(seconds taken, HTTP status, the error message: a JSON error's, or a streamed error event's)."""
    path, body = BAD_REQUESTS[name]
    started = time.monotonic()
    r = requests.post(f"{base_url}{path}", json=body, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    if r.headers.get("content-type", "").startswith("text/event-stream"):  # an error after the status line
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        errors = [e["error"] for e in events if "error" in e]
        assert errors, f"{name}: a stream without an error event: {r.text[:300]!r}"
        return elapsed, errors[-1].get("code", r.status_code), errors[-1].get("message", "")
    return elapsed, r.status_code, r.json().get("error", {}).get("message", r.text)


def wait_idle(base_url: str, timeout: float = 10) -> None:
    """No request runs or waits and none holds KV: the failed ones were released."""
    deadline = time.monotonic() + timeout
    while True:
        s = requests.get(f"{base_url}/server_info", timeout=TIMEOUT).json()["scheduler_stats"]
        if s["num_running_reqs"] == 0 and s["num_queued_reqs"] == 0 and s["num_used_tokens"] == 0:
            return
        assert time.monotonic() < deadline, f"not idle after {timeout} s: {s}"
        time.sleep(0.25)


def test_pathological_stop_regex_fails_its_request_only(base_url):
    expected = good_text(base_url)  # alone first
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(good_text, base_url)
        results, in_flight = {}, False
        for name in BAD_REQUESTS:
            results[name] = send_bad(base_url, name)
            in_flight = in_flight or not good.done()
        assert good.result() == expected  # the concurrent normal request is unharmed
    problems = [
        f"{name}: {status} after {elapsed:.1f} s: {message!r}"
        for name, (elapsed, status, message) in results.items()
        if status != 400 or "stop_regex" not in message or elapsed > PROMPT_BOUND_S
    ]
    assert not problems, "\n".join(problems)
    assert in_flight, "the normal request finished before the bad ones were sent; the test proves nothing"


def test_server_healthy_afterwards(base_url):
    send_bad(base_url, "generate")
    assert requests.get(f"{base_url}/health", timeout=TIMEOUT).status_code == 200
    assert requests.get(f"{base_url}/health_generate", timeout=TIMEOUT).status_code == 200
    assert good_text(base_url)
    wait_idle(base_url)
