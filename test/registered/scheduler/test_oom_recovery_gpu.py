"""A real CUDA out-of-memory error while serving: a neighbour process takes all but 256 MiB of the
free GPU memory, the next long prefill runs out of memory, that request is answered 503 (its batch
aborted, its KV freed), the server stays up, and once the neighbour frees the memory the same
request gets 200 with the output a fresh run gives. The server counts it in
sglang:num_oom_recoveries_total and logs the memory summary once.

Shape: Llama-3.1-8B with dummy weights, static path (a prefill of 8000 tokens needs ~1 GiB of
activations, far more than the 256 MiB the neighbour leaves)."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=150, suite="per-commit-cuda")

import re
import subprocess
import sys
import textwrap

import pytest
import requests

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, shape_config_dir
from sglang.test.test_utils import kill_process_tree, popen_launch_server, read_log, server_env

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

LEAVE_FREE_MIB = 256
HOG = textwrap.dedent(f"""
    import sys, torch
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - {LEAVE_FREE_MIB} * 2**20, dtype=torch.uint8, device="cuda")
    print("holding", hog.numel() // 2**20, "MiB", flush=True)
    sys.stdin.read()  # until the test closes our stdin
""")
LONG_PROMPT = [(7 * i) % 120000 + 10 for i in range(8000)]


def generate(url: str, ids, tokens: int = 8) -> requests.Response:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}
    return requests.post(f"{url}/generate", json=body, timeout=300)


def metric(url: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", requests.get(f"{url}/metrics", timeout=30).text, re.M)
    return float(m.group(1)) if m else float("nan")


def test_real_cuda_oom_is_answered_503_and_the_server_recovers(tmp_path):
    model = shape_config_dir("Llama-3.1-8B", root=str(tmp_path))
    proc = popen_launch_server(
        ["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init", "--chunked-prefill-size", "8192"],
        timeout=600,
    )
    hog = None
    try:
        url = proc.base_url
        assert generate(url, [1, 2, 3]).status_code == 200
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=server_env()
        )
        assert hog.stdout.readline().startswith("holding"), "the neighbour could not take the memory"
        r = generate(url, LONG_PROMPT)
        print("with the neighbour:", r.status_code, r.text[:300])
        assert r.status_code == 503 and "ran out of device memory" in r.json()["error"]["message"], r.text
        assert requests.get(f"{url}/health", timeout=30).status_code == 200
        hog.stdin.close()
        hog.wait(60)
        hog = None
        r = generate(url, LONG_PROMPT)
        assert r.status_code == 200, r.text
        assert len(r.json()["output_ids"]) == 8
        assert generate(url, LONG_PROMPT).json()["output_ids"] == r.json()["output_ids"]
        assert metric(url, "sglang:num_oom_recoveries_total") == 1
        log = read_log(proc)
        assert log.count("First out-of-memory error") == 1
        print("after the neighbour left: 200, recoveries counted 1")
    finally:
        if hog is not None:
            hog.kill()
        kill_process_tree(proc.pid)
