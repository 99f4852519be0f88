"""Two replicas of our server behind upstream's router (PyPI sglang-router 0.3.2, in its own virtualenv):
it registers both (reading /server_info and /get_model_info), its load view shows both from /get_load,
concurrent requests use both, and a replica stopped with SIGTERM in the middle of traffic loses no request.
The first replica is the session's shared SmolLM2 server (conftest.py); the second, the one stopped, is this
module's own."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=50, suite="per-commit-cpu")

import os
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from sglang.test.router_client import ensure_router_venv, launch_router
from sglang.test.test_utils import find_free_port, kill_process_tree, popen_launch_server

TIMEOUT = 300


@pytest.fixture(scope="module")
def cluster(smollm2_server):
    with ThreadPoolExecutor(2) as pool:  # the router's venv builds while the second replica starts
        venv = pool.submit(ensure_router_venv)
        own = popen_launch_server(["--max-total-tokens", "4096"])
    workers = [smollm2_server, own]
    port = find_free_port()
    log = tempfile.NamedTemporaryFile(prefix="sglang-router-", suffix=".log", delete=False).name
    router = launch_router(venv.result(), [w.base_url for w in workers], port, find_free_port(), log)
    yield f"http://127.0.0.1:{port}", workers
    router.kill()
    router.wait(10)
    kill_process_tree(own.pid)
    own.wait(10)


def requests_served(base_url: str) -> float:
    metrics = requests.get(f"{base_url}/metrics", timeout=TIMEOUT).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("sglang:num_requests_total"))


def test_the_router_registers_both_replicas_with_their_load(cluster):
    url, workers = cluster
    listed = requests.get(f"{url}/workers", timeout=TIMEOUT).json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(w.base_url for w in workers)
    for w in listed:
        assert w["is_healthy"] and w["metadata"]["dp_size"] == "1" and w["metadata"]["disaggregation_mode"] == "null"
    loads = requests.get(f"{url}/get_loads", timeout=TIMEOUT).json()["workers"]
    assert [entry["load"] for entry in loads] == [0, 0]  # read from /get_load (-1 when a worker has none)


def test_concurrent_requests_use_both_replicas(cluster):
    url, workers = cluster
    before = [requests_served(w.base_url) for w in workers]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)

    def ask(i: int) -> str:
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"{i}: name a fruit"}], max_tokens=4
        )
        return r.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert all(isinstance(a, str) for a in answers)
    served = [requests_served(w.base_url) - b for w, b in zip(workers, before)]
    assert sum(served) == 8 and min(served) >= 1, served


def test_stopping_a_replica_loses_no_request(cluster):
    url, workers = cluster
    statuses, lock = [], threading.Lock()

    def generate(i: int) -> None:
        body = {"text": f"Tale {i}: a dragon", "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
        r = requests.post(f"{url}/generate", json=body, timeout=TIMEOUT)
        with lock:
            statuses.append(r.status_code)

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(12)]
    for i, t in enumerate(threads):
        t.start()
        if i == 3:
            os.kill(workers[1].pid, signal.SIGTERM)  # drains what it runs, refuses the rest: the router retries
    for t in threads:
        t.join()
    assert statuses == [200] * 12
    assert workers[1].wait(60) == 0
