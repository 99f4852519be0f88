"""Post-capture KV sizing end to end on the GPU: the server starts with the flag on, logs the sizing
line, reports the pool in /server_info (more tokens than the static path for the same flags),
generates exactly what the static server generates, and survives a worst-case load.

Shape: Llama-3.1-8B (dummy weights). Flags make decode run eagerly above the captured batch size:
--cuda-graph-max-bs 32 --max-running-requests 64.
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=420, suite="per-commit-cuda")

import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
import requests

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

FLAGS = ["--cuda-graph-max-bs", "32", "--max-running-requests", "64", "--skip-tokenizer-init", "--load-format", "dummy"]
PROMPTS = [[11, 22, 33, 44, 55], list(range(100, 160)), list(range(7, 7 + 300, 3))]
SIZING_LINE = re.compile(r"Post-capture KV sizing: max_total_num_tokens=(\d+)")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, post_capture: bool) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        env = dict(os.environ, SGLANG_ENABLE_POST_CAPTURE_KV_SIZING="1" if post_capture else "0")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(self.port), *FLAGS],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.time() + 600
        while time.time() < deadline:
            assert self.proc.poll() is None, f"server exited early:\n{self.text()[-4000:]}"
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise TimeoutError(self.text()[-4000:])

    def text(self) -> str:
        with open(self.log.name) as f:
            return f.read()

    def info(self) -> dict:
        return requests.get(f"{self.url}/server_info", timeout=30).json()

    def generate(self, ids, max_new_tokens: int, timeout: float = 600) -> dict:
        r = requests.post(
            f"{self.url}/generate",
            json={
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
            },
            timeout=timeout,
        )
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def model() -> str:
    return shape_config_dir("Llama-3.1-8B")


@pytest.fixture(scope="module")
def static_result(model):
    server = Server(model, post_capture=False)
    try:
        info = server.info()
        outputs = [server.generate(p, 16)["output_ids"] for p in PROMPTS]
        assert SIZING_LINE.search(server.text()) is None
        return info, outputs
    finally:
        server.stop()


def test_post_capture_server(model, static_result):
    static_info, static_outputs = static_result
    server = Server(model, post_capture=True)
    try:
        logged = SIZING_LINE.findall(server.text())
        assert len(logged) == 1, server.text()[-3000:]
        info = server.info()
        plan = info["memory_plan"]
        tokens = info["max_total_num_tokens"]
        print(f"post-capture tokens {tokens}, static tokens {static_info['max_total_num_tokens']}; plan {plan}")
        assert plan["path"] == "post-capture"
        assert tokens == int(logged[0]) == plan["max_total_num_tokens"] > 0
        assert tokens > static_info["max_total_num_tokens"]
        assert "measured" in plan["headroom_rule"]
        assert plan["activation_peak_gb"] > 0
        assert "cuda_graph_max_bs=32 < max_running_requests=64" in server.text()  # the eager-decode warning
        assert plan["sglang_rule_tokens"] < tokens  # SGLang's rule would floor to the activation reserve

        # Greedy outputs equal the static server's.
        assert [server.generate(p, 16)["output_ids"] for p in PROMPTS] == static_outputs

        # Worst-case load: max_running_requests long-context decodes (eager above 32) plus full
        # chunked prefills from 16 more long prompts queued behind them.
        ctx = min(tokens // 80, 8000)
        prompts = [[(i * 7919 + j) % 120000 + 1 for j in range(ctx)] for i in range(64 + 16)]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(lambda p: server.generate(p, 32, timeout=1200), prompts))
        assert all(len(r["output_ids"]) == 32 for r in results)
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
        log = server.text()
        assert "out of memory" not in log.lower() and "Traceback" not in log, log[-3000:]
    finally:
        server.stop()
